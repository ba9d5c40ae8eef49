#!/usr/bin/env bash
# One GPU session of checks, as run on the lent H100/H200 (see the issue notes for figures):
#   bash benchmarks/gpu_session.sh tests|bench
# Logs go to $OUT (default ./gpu-logs). Wheels the image lacks are expected in .whl/.
set -uo pipefail
OUT=${OUT:-gpu-logs}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src:$PWD
fi
export STITCHCUDA_CACHE=${STITCHCUDA_CACHE:-$PWD/.stitchcuda/cache}
case "${1:-tests}" in
  tests)
    python3 -m stitchcuda.cli doctor > "$OUT/doctor.txt" 2>&1; echo "doctor rc=$?"
    python3 -m pytest -m gpu -v -s -rA tests/test_gpu.py > "$OUT/pytest_gpu.txt" 2>&1; echo "pytest rc=$?"
    tail -n 25 "$OUT/pytest_gpu.txt"; cat "$OUT/doctor.txt"
    ;;
  bench)
    python3 benchmarks/suite_eager_times.py > "$OUT/suite.txt" 2>&1; echo "suite rc=$?"
    python3 benchmarks/verify_bench.py --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1; echo "bench rc=$?"
    python3 -m stitchcuda.cli verify mlp examples/mlp_cuda.py > "$OUT/verify_example.txt" 2>&1; echo "verify rc=$?"
    cat "$OUT/suite.txt" "$OUT/bench.txt"; tail -n 30 "$OUT/verify_example.txt"
    ;;
esac
