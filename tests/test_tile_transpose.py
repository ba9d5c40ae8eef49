"""The transposing conversions (split 3xTF32 halves, bf16 copies, channels-last and back), all one
tiled loop (templates/kernels/tile_transpose.cuh), run on the CPU through a small CUDA emulation
(tests/fixtures/cuda_on_cpu/: a block's threads as std::threads meeting at __syncthreads) and
held to numpy element by element, on sizes that are not multiples of the 32x32 tile."""

from __future__ import annotations

import numpy as np
import pytest

from stitchcuda.compiler.lowering.cuda_files import cuda_file
from tests.cuda_on_cpu import run_on_cpu

B, R, C, GROUP = 2, 70, 45, 10  # two matrices of R x C; as images, R channels (7 groups) of C pixels

MAIN = r"""
#include <cstdio>
template <class T> void put(const char* dir, const char* name, const std::vector<T>& v) {
  std::FILE* f = std::fopen((std::string(dir) + "/" + name).c_str(), "wb");
  std::fwrite(v.data(), sizeof(T), v.size(), f);
  std::fclose(f);
}
int main(int, char** argv) {
  const int B = %(B)d, R = %(R)d, C = %(C)d, G = %(G)d;
  const long long per = (long long)R * C;
  std::vector<float> x(B * per);
  std::FILE* in = std::fopen((std::string(argv[1]) + "/x").c_str(), "rb");
  if (std::fread(x.data(), 4, x.size(), in) != x.size()) return 1;
  std::fclose(in);
  const dim3 block{32, 8, 1}, mats{(C + 31) / 32, (R + 31) / 32, B};
  std::vector<float> halves(3 * B * per, -1.f);
  launch(mats, block, [&] { sc_split_tf32_t(x.data(), halves.data(), R, C, per, C, per, R, 0, B * per, 2 * B * per, B, 0); });
  put(argv[1], "split_t", halves);
  std::vector<__nv_bfloat16> bf(B * per);
  launch(mats, block, [&] { sc_to_bf16_t(x.data(), bf.data(), R, C, per, C, per, R, B, 0); });
  put(argv[1], "bf16_t", bf);
  std::vector<float> nhwc3(3 * B * per, -1.f);  // x as [B, R channels, C pixels]
  launch(mats, block, [&] { sc_split3_nhwc(x.data(), nhwc3.data(), R, G, C, 5); });
  put(argv[1], "split3_nhwc", nhwc3);
  std::vector<__nv_bfloat16> nhwc(B * per);
  launch(mats, block, [&] { sc_nhwc_bf16(x.data(), nhwc.data(), R, C); });
  put(argv[1], "nhwc_bf16", nhwc);
  std::vector<float> back(B * per, -1.f);  // x as [B, C pixels, R channels]
  launch(mats, block, [&] { sc_nhwc_to_nchw(x.data(), back.data(), R, C); });
  put(argv[1], "nhwc_to_nchw", back);
  std::vector<float> back_bf(B * per, -1.f);
  launch(mats, block, [&] { sc_nhwc_bf16_to_nchw(nhwc.data(), back_bf.data(), R, C); });
  put(argv[1], "nhwc_bf16_to_nchw", back_bf);
}
"""


def _tf32(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32)
    finite = (u & 0x7F800000) != 0x7F800000
    return np.where(finite, (u + 0x1000) & 0xFFFFE000, u).astype(np.uint32).view(np.float32)


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _halves(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    big = _tf32(x)
    with np.errstate(invalid="ignore"):
        small = np.where(np.isfinite(x), _tf32(x - big), 0.0).astype(np.float32)
    return big, small


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tile")
    x = (np.sin(np.arange(B * R * C) * 0.37) * 3).astype(np.float32)
    x[7] = np.inf  # the split keeps it in the big half, with a zero small one
    x.tofile(root / "x")
    run_on_cpu(root, cuda_file("tile_transpose.cuh"), cuda_file("split_tf32.cuh"), cuda_file("bf16_convert.cuh"),
               MAIN % {"B": B, "R": R, "C": C, "G": GROUP}, timeout=120)

    def read(name: str, dtype) -> np.ndarray:
        return np.fromfile(root / name, dtype=dtype)

    return x.reshape(B, R, C), read


def test_the_transposed_split_writes_both_halves_and_the_second_big_copy(outputs):
    x, read = outputs
    big, small = _halves(x.transpose(0, 2, 1))
    got = read("split_t", np.float32).reshape(3, B, C, R)
    np.testing.assert_array_equal(got[0], big)
    np.testing.assert_array_equal(got[1], small)
    np.testing.assert_array_equal(got[2], big)
    assert np.isinf(got[0]).sum() == 1 and not np.isinf(got[1]).any()


def test_the_transposed_bf16_copy_rounds_to_nearest_even(outputs):
    x, read = outputs
    np.testing.assert_array_equal(read("bf16_t", np.uint16).reshape(B, C, R), _bf16_bits(x.transpose(0, 2, 1)))


def test_an_image_goes_channels_last_as_three_copies_of_its_halves(outputs):
    x, read = outputs
    big, small = _halves(x.transpose(0, 2, 1))  # [B, pixels, channels]
    got = read("split3_nhwc", np.float32).reshape(B, C, R // GROUP, 3, GROUP)
    per_group = (B, C, R // GROUP, GROUP)
    np.testing.assert_array_equal(got[:, :, :, 0], small.reshape(per_group))  # small_at = 5: copies 0 and 2
    np.testing.assert_array_equal(got[:, :, :, 1], big.reshape(per_group))
    np.testing.assert_array_equal(got[:, :, :, 2], small.reshape(per_group))


def test_channels_last_and_back(outputs):
    x, read = outputs
    np.testing.assert_array_equal(read("nhwc_bf16", np.uint16).reshape(B, C, R), _bf16_bits(x.transpose(0, 2, 1)))
    as_nhwc = x.reshape(B, C, R)  # the same memory read as [B, pixels, channels]
    np.testing.assert_array_equal(read("nhwc_to_nchw", np.float32).reshape(B, R, C), as_nhwc.transpose(0, 2, 1))
    bf = (_bf16_bits(x.transpose(0, 2, 1)).astype(np.uint32) << 16).view(np.float32)  # [B, pixels, channels]
    np.testing.assert_array_equal(read("nhwc_bf16_to_nchw", np.float32).reshape(B, R, C), bf.transpose(0, 2, 1))
