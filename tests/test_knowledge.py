"""The agents' knowledge index: notes, header declarations, FTS5 search, compiler-error identifiers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stitchcuda.agents.knowledge import KnowledgeBase, format_hits, identifiers_in_compiler_error, load_notes
from stitchcuda.agents.knowledge.headers import extract_header, find_headers
from stitchcuda.agents.knowledge.index import NOTES_DIR, tokenize

NVCC_ERRORS = """\
/root/.cache/torch_extensions/py312_cu130/ext_3f2a/cuda.cu(57): error: identifier "cublasLtMatmulDescSetAttributes" is undefined
      cublasLtMatmulDescSetAttributes(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
      ^

/root/.cache/torch_extensions/py312_cu130/ext_3f2a/cuda.cu(80): error: no instance of overloaded function "__shfl_down_sync" matches the argument list
            argument types are: (int, float, int)
        v += __shfl_down_sync(v, 16);
             ^

2 errors detected in the compilation of "/root/.cache/torch_extensions/py312_cu130/ext_3f2a/cuda.cu".
ninja: build stopped: subcommand failed.
"""

GCC_AND_LINK_ERRORS = """\
main.cpp: In function 'at::Tensor forward(at::Tensor)':
main.cpp:12:5: error: \u2018cudaMemcpyAsyn\u2019 was not declared in this scope
main.cpp:20:3: error: no matching function for call to 'cublasSgemm(cublasContext*&, int, int)'
/usr/bin/ld: cuda.cuda.o: in function `linear_act(at::Tensor)': cuda.cu:(.text+0x1b2): undefined reference to `cublasLtMatmul'
collect2: error: ld returned 1 exit status
ImportError: /root/.cache/torch_extensions/ext/ext.so: undefined symbol: _ZN2at4cuda26getCurrentCUDABlasLtHandleEv
"""

MINI_HEADER = """\
#define MYAPI __attribute__((visibility("default")))
#define MYWINAPI
#ifdef __cplusplus
extern "C" {
#endif
typedef struct myOpaque* myHandle_t;
/** Kinds of post-processing. */
typedef enum {
  MY_EPILOGUE_DEFAULT = 1, /**< nothing */
  /** add a bias vector */
  MY_EPILOGUE_BIAS = 4,
  MY_EPILOGUE_RELU_BIAS = (MY_EPILOGUE_BIAS | 2),
} myEpilogue_t;
/**
 * \\brief Sets one attribute of a descriptor.
 *
 * Longer text that is not the first line.
 */
MYAPI int MYWINAPI myDescSetAttribute(myHandle_t h,
                                      int attr, const void *buf, size_t n);
extern __host__ __cudart_builtin__ int MYWINAPI myCopyAsync(void *dst, const void *src, size_t n, int stream __dv(0));
__MY_DECL__ float my_shfl(unsigned mask, float v, int lane, int width=warpSize) __DEF_IF_HOST
__MY_DECL__ int my_shfl(unsigned mask, int v, int lane, int width=warpSize) __DEF_IF_HOST
static inline int helper(int a) { return my_other(a) + 1; }
/** Runs the thing (D = A * B).
 *
 * \retval  MY_OK  when it worked
 */
int MYWINAPI myRun(myHandle_t h,  //
                   const void* alpha, /* host or device pointer */
                   void* D,
                   myStream_t stream);
typedef void (*myCallback_t)(int level, const char* msg);
int MYWINAPI myVoid();
#ifdef __cplusplus
}
#endif
"""



def test_notes_load_with_title_and_tags():
    notes = load_notes()
    assert 10 <= len(notes) <= 18
    for note in notes:
        assert note.title, note.name
        assert note.tags, note.name
        lines = note.text.splitlines()
        assert lines[0].startswith("# ") and lines[1].startswith("tags:"), note.name
        assert 40 <= len(lines) <= 120, (note.name, len(lines))
        assert note.text.count("```") % 2 == 0, note.name


def test_tokenizer_splits_identifiers():
    toks = tokenize("cublasLtMatmulDescSetAttribute")
    for part in ("cublaslt" + "matmuldescsetattribute", "matmul", "desc", "attribute"):
        assert part in toks
    assert set(tokenize("matmul desc attribute")) <= set(toks)
    assert {"shfl_xor_sync", "shuffle", "xor"} <= set(tokenize("__shfl_xor_sync"))
    assert set(tokenize("CUBLASLT_EPILOGUE_GELU_BIAS")) >= {"cublas", "lt", "epilogue", "gelu", "bias"}
    assert "the" not in tokenize("the shuffle")


def test_fts5_stems_what_the_tokenizer_leaves_whole(kb):
    """Stemming is FTS5's porter tokenizer: other forms of a note's words still find it."""
    assert kb.search("shuffling reductions", k=1, kind="note")[0].source.startswith("notes/warp-reductions.md")
    assert kb.search("capturing graphs", k=1, kind="note")[0].source.startswith("notes/cuda-graphs.md")


def test_search_finds_epilogue_note(kb):
    hits = kb.search("fuse bias and gelu into the gemm", k=3)
    assert hits and hits[0].kind == "note"
    assert hits[0].source.startswith("notes/cublaslt-epilogues.md")


def test_search_finds_warp_reduction_note(kb):
    hits = kb.search("shuffle reduce", k=3, kind="note")
    assert hits[0].source.startswith("notes/warp-reductions.md")


@pytest.mark.parametrize(
    ("query", "note"),
    [
        ("what breaks cuda graph capture", "cuda-graphs"),
        ("float4 alignment tail", "vectorized-memory"),
        ("welford variance layer norm", "softmax-layernorm"),
        ("bank conflicts padding shared memory", "tiled-gemm-shared-memory"),
        ("ptxas spill stores registers", "ptxas-resource-usage"),
        ("lstm gate order", "recurrent-networks"),
        ("unsynchronised side stream", "streams-events-pinned"),
        ("tf32 tolerance mismatch", "fp32-precision"),
        ("cudnn convolution math type", "cudnn-convolution"),
        ("strided batched bmm", "cublas-gemm"),
        ("launch bounds occupancy registers", "occupancy-launch-config"),
    ],
)
def test_search_routes_topics(kb, query, note):
    assert kb.search(query, k=1, kind="note")[0].source.startswith(f"notes/{note}.md")


def test_hits_are_typed_and_formatted(kb):
    hits = kb.search("online softmax", k=4)
    assert all(0 < h.score <= 1 for h in hits)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    text = format_hits(hits, max_chars=1200)
    assert 0 < len(text) <= 1200 and text.startswith("### ")
    assert text.count("```") % 2 == 0
    assert format_hits([], 100) == ""


def test_extract_header_handles_macros(tmp_path: Path):
    header = tmp_path / "mini.h"
    header.write_text(MINI_HEADER)
    docs = {(d.what, d.name): d for d in extract_header(header)}
    fn = docs[("function", "myDescSetAttribute")]
    assert fn.signature == "int myDescSetAttribute(myHandle_t h, int attr, const void *buf, size_t n);"
    assert fn.doc == "Sets one attribute of a descriptor."
    assert docs[("function", "myCopyAsync")].signature.endswith("int stream = 0);")
    shfl = [d for d in extract_header(header) if d.name == "my_shfl"]
    assert len(shfl) == 2 and shfl[0].signature.startswith("float my_shfl(")
    assert ("function", "my_other") not in docs  # a call inside a body is not a declaration
    assert docs[("enumerator", "MY_EPILOGUE_DEFAULT")].doc == "nothing"
    assert docs[("enumerator", "MY_EPILOGUE_BIAS")].doc == "add a bias vector"
    assert "MY_EPILOGUE_RELU_BIAS" in docs[("enum", "myEpilogue_t")].signature
    assert ("typedef", "myHandle_t") in docs
    run = docs[("function", "myRun")]
    assert run.signature == "int myRun(myHandle_t h, const void* alpha, void* D, myStream_t stream);"
    assert run.doc == "Runs the thing (D = A * B)."
    assert docs[("function", "helper")].signature == "int helper(int a);"
    assert ("function", "myVoid") in docs and ("function", "myCallback_t") not in docs


def test_identifiers_from_nvcc_errors(kb):
    ids = kb.identifiers_in_compiler_error(NVCC_ERRORS)
    assert ids[0] == "cublasLtMatmulDescSetAttributes"
    assert "cublasLtMatmulDescSetAttribute" in ids  # the closest real name
    assert "__shfl_down_sync" in ids and "CUBLASLT_MATMUL_DESC_EPILOGUE" in ids
    assert not any(i.startswith("ext_") or i.endswith(".cu") for i in ids)


def test_identifiers_from_gcc_and_linker_errors(kb):
    ids = identifiers_in_compiler_error(GCC_AND_LINK_ERRORS, kb=kb)
    for name in ("cudaMemcpyAsyn", "cublasSgemm", "cublasLtMatmul", "getCurrentCUDABlasLtHandle"):
        assert name in ids
    assert "cudaMemcpyAsync" in ids  # suggested for the misspelt cudaMemcpyAsyn
    assert "__global__" not in ids


def test_closest_name_for_misspelling(kb):
    assert kb.closest_api_names("cublasLtMatmulDescSetAttributes")[0] == "cublasLtMatmulDescSetAttribute"


def _headers_or_skip() -> None:
    if not any(rel == "cuda_runtime_api.h" for _, rel in find_headers(torch_headers=False)):
        pytest.skip("no CUDA toolkit headers on this machine")


def test_lookup_api_returns_header_signature(kb):
    _headers_or_skip()
    hits = kb.lookup_api(["cudaMemcpyAsync"])
    assert hits[0].kind == "api" and hits[0].title == "cudaMemcpyAsync" and hits[0].score == 1.0
    assert "cudaStream_t stream" in hits[0].text and hits[0].source.startswith("cuda_runtime_api.h:")
    shfl = kb.lookup_api(["__shfl_xor_sync"])
    assert shfl and "float __shfl_xor_sync(" in shfl[0].text  # fp32 overload first


def test_lookup_api_suggests_for_misspelt_header_name(kb):
    _headers_or_skip()
    hits = kb.lookup_api(["cudaStreamBeginCaptur"])
    assert hits and hits[0].title == "cudaStreamBeginCapture" and hits[0].score < 1.0
    assert "cudaStreamBeginCapture" in kb.identifiers_in_compiler_error(
        'k.cu(3): error: identifier "cudaStreamBeginCaptur" is undefined'
    )


def test_enum_values_are_indexed(kb):
    _headers_or_skip()
    hits = kb.lookup_api(["cudaStreamCaptureModeThreadLocal"])
    assert hits and "cudaStreamCaptureMode" in hits[0].text
    assert kb.search("stream capture mode thread local", k=3, kind="api")


def test_cublaslt_declarations_when_present(kb):
    if not any(rel == "cublasLt.h" for _, rel in find_headers(torch_headers=False)):
        pytest.skip("cublasLt.h not installed here")
    hit = kb.lookup_api(["cublasLtMatmulDescSetAttribute"])[0]
    assert "cublasLtMatmulDescAttributes_t" in hit.text
    assert kb.lookup_api(["CUBLASLT_EPILOGUE_GELU_BIAS"])
    assert kb.lookup_api(["cublasSgemm"])[0].title.startswith("cublasSgemm")  # the _v2 alias


def test_index_builds_fast_when_warm(kb, tmp_path, monkeypatch):
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path))
    KnowledgeBase.build()  # cold: extracts and writes the cache
    assert list((tmp_path / "knowledge").glob("api-*.json")) or not find_headers()
    start = time.perf_counter()
    warm = KnowledgeBase.build()
    assert time.perf_counter() - start < 2.0
    assert warm.size() == kb.size()


def test_notes_dir_is_package_data():
    assert NOTES_DIR.is_dir() and NOTES_DIR.parent.name == "knowledge"
    pyproject = Path(__file__).parents[1] / "pyproject.toml"
    assert "agents/knowledge/notes/*.md" in pyproject.read_text()


def test_search_finds_build_time_note(kb):
    hits = kb.search("load_inline compile time: slow build with torch/extension.h headers", k=3, kind="note")
    assert hits[0].source.startswith("notes/fast-builds.md"), [h.source for h in hits]


def test_enumerator_docs_in_leading_comma_style(tmp_path: Path):
    """driver_types.h puts the comma before each enumerator: a trailing doc belongs to its own line's item."""
    header = tmp_path / "lead.h"
    header.write_text("enum myKind {\n    myKindA = 1 /**< first */\n  , myKindB = 2 /**< second */\n};\n")
    docs = {d.name: d.doc for d in extract_header(header)}
    assert docs["myKindA"] == "first" and docs["myKindB"] == "second"


def test_search_answers_an_nvcc_log(kb):
    """The build folder's path in the log does not drown the error: the shuffle note comes first."""
    log = ('/root/.cache/torch_extensions/py311_cu124/ext_91c2/cuda.cu(41): error: identifier "__shfl_down" '
           'is undefined\n          val += __shfl_down(val, offset);\n                 ^\n')
    assert kb.search(log, k=1, kind="note")[0].source.startswith("notes/warp-reductions.md")
    atomic = ('k.cu(33): error: no instance of overloaded function "atomicAdd" matches the argument list\n'
              '            argument types are: (c10::Half *, c10::Half)\n')
    assert kb.identifiers_in_compiler_error(atomic) == ["atomicAdd"]
