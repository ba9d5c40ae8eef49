"""Declarations read from this machine's CUDA headers (and a few torch ones): the search's API corpus.

Regular expressions over the header text with its comments, strings and preprocessor lines blanked out,
not a C++ parser. pycparser cannot read C++ or CUDA, and libclang would need each header's whole include
tree and the compiler's configuration (torch's headers pull in hundreds of files) to reach the same
result. What the search needs is modest: the names an error may mention, a signature that shows the
argument list, and the first line of the doc comment, so a miss on an exotic C++ template costs little.

Extraction takes about half a second, so the declarations are cached as JSON under
``stitchcuda.paths.cache_root()``, keyed by the header paths, sizes and mtimes.
"""

from __future__ import annotations

import bisect
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, TypeAdapter

from stitchcuda import machine
from stitchcuda.paths import cache_root

EXTRACTOR_VERSION = 4

# CUDA toolkit headers, in the order their declarations are preferred (the float overloads of the
# shuffles in sm_30_intrinsics.h come before the half ones of cuda_fp16.h).
CUDA_HEADERS: tuple[str, ...] = (
    "cuda_runtime_api.h",
    "driver_types.h",
    "library_types.h",
    "cublas_api.h",
    "cublasLt.h",
    "sm_30_intrinsics.h",
    "sm_32_intrinsics.h",
    "cooperative_groups.h",
    "cooperative_groups/details/reduce.h",
    "cooperative_groups/details/functional.h",
    "cooperative_groups/details/async.h",
    "cuda_pipeline_primitives.h",
    "cuda_fp16.h",
    "cuda_bf16.h",
)
CUDNN_GLOB = "cudnn*.h"
# Torch headers a load_inline extension includes for streams, handles and graphs.
TORCH_HEADERS: tuple[str, ...] = (
    "ATen/cuda/CUDAContextLight.h",
    "c10/cuda/CUDAStream.h",
    "c10/cuda/CUDAGuard.h",
    "ATen/cuda/CUDAGraph.h",
    "ATen/cuda/CUDAEvent.h",
    "ATen/cudnn/Handle.h",
)


class Decl(BaseModel):
    """One declaration read from a header."""

    what: Literal["function", "enum", "enumerator", "typedef"]
    name: str
    aliases: list[str]  # names an exact lookup finds it by (``cublasSgemm`` for ``cublasSgemm_v2``)
    signature: str
    doc: str = ""
    header: str
    line: int


# ---------------------------------------------------------------------------------------------------
# Finding the headers


def cuda_include_dirs() -> list[Path]:
    """Include folders that may hold CUDA headers, most specific first, existing ones only."""
    seen: list[Path] = []

    def add(path: Path | str | None) -> None:
        if not path:
            return
        p = Path(path)
        if p.is_dir():
            resolved = p.resolve()
            if resolved not in [s.resolve() for s in seen]:
                seen.append(p)

    for extra in os.environ.get("STITCHCUDA_CUDA_INCLUDE", "").split(os.pathsep):
        add(extra or None)
    if home := machine.cuda_home():
        add(Path(home) / "include")
    if nvcc := machine.nvcc_path():  # an nvcc on PATH beside its headers, outside the toolkit folder
        add(Path(nvcc).parent.parent / "include")
    # pip wheels of the CUDA libraries (what torch's CUDA builds depend on): nvidia/<lib>/include
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir():
            for inc in sorted(root.glob("*/include")):
                add(inc)
    add("/usr/include")
    add("/usr/include/x86_64-linux-gnu")
    return seen


def _torch_include_dir() -> Path | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    inc = Path(next(iter(spec.submodule_search_locations))) / "include"
    return inc if inc.is_dir() else None


def find_headers(
    include_dirs: Sequence[Path] | None = None, torch_headers: bool = True
) -> list[tuple[Path, str]]:
    """``(path, name relative to its include folder)`` for each header we index, first folder wins."""
    dirs = list(include_dirs) if include_dirs is not None else cuda_include_dirs()
    found: dict[str, Path] = {}
    for name in CUDA_HEADERS:
        for d in dirs:
            if (d / name).is_file():
                found[name] = d / name
                break
    for d in dirs:
        for p in sorted(d.glob(CUDNN_GLOB)):
            if p.name not in found and p.is_file():
                found[p.name] = p
    if torch_headers and (inc := _torch_include_dir()) is not None:
        for name in TORCH_HEADERS:
            if (inc / name).is_file():
                found[name] = inc / name
    return [(path, name) for name, path in found.items()]


# ---------------------------------------------------------------------------------------------------
# Reading one header

def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Consecutive // lines are one comment: torch documents its functions that way.
_LEX_RE = re.compile(r"/\*.*?\*/|//[^\n]*(?:\n[ \t]*//[^\n]*)*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
_PP_RE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_GROUP_RE = re.compile(r"[\\@](?:defgroup|addtogroup|name)\b|@\{|@\}")
_MACRO_RE = re.compile(r"^_*[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_*$")
_DECORATIONS = frozenset(("__attribute__", "__declspec", "alignas", "__align__", "__dv"))
_MACRO_CALL_RE = re.compile(
    r"\b(?:_*[A-Z][A-Z0-9_]*|__attribute__|__declspec|alignas|__align__)\s*\((?:[^()]|\([^()]*\))*\)"
)
_ACCESS_RE = re.compile(r"\b(?:public|private|protected)\s*:(?!:)")
_STORAGE_RE = re.compile(
    r"\b(?:extern|static|inline|__inline__|__forceinline__|__cudart_builtin__|__device_builtin__|friend)\b"
)
_ARROW = r"->\s*(?:decltype\s*\((?:[^()]|\([^()]*\))*\)|[\w:\*&<> ]+)"
# What may follow a parameter list: qualifiers, a trailing return type, attribute macros.
_TRAIL_RE = re.compile(rf"(?:\s*(?:const|noexcept|override|final|volatile|throw\s*\(\s*\)|{_ARROW}|_*[A-Z][A-Z0-9_]*\b))*\s*")
# sm_30_intrinsics.h ends declarations with a macro (__DEF_IF_HOST) and no semicolon: the line ends them.
_LINE_END_RE = re.compile(r"(?:[ \t]*(?:const|noexcept|_*[A-Z][A-Z0-9_]*\b))*[ \t]*(?:\n|$)")
_CANDIDATE_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_NOT_FUNCTIONS = _DECORATIONS | _words(
    "if for while switch return sizeof alignof decltype static_assert operator catch defined typeid new delete "
    "throw noexcept case do else using typedef template requires namespace __launch_bounds__"
)
_BAD_START = _words("return if else while for switch case do goto throw new delete using typedef namespace")
_ENUM_RE = re.compile(
    r"\benum\b(?:\s+(?:class|struct)\b)?((?:\s+[A-Za-z_]\w*)*)\s*(?::\s*[\w\s:]+?)?\s*\{([^{}]*)\}\s*([A-Za-z_]\w*)?"
)
_ENUMERATOR_RE = re.compile(r"([A-Za-z_]\w*)\s*(?:=\s*([^,]*))?(?:,|$)")
_TYPEDEF_RE = re.compile(r"\btypedef\s+([^;{}()]+?)[\s\*]+([A-Za-z_]\w*)\s*;")


class _Header:
    """A header's code with comments, strings and preprocessor lines blanked (offsets kept), and its comments.

    A comment alone on its line documents the code that follows it (``leading``, by that code's offset);
    one after code on its line documents that line (``trailing``, by line number: ``X = 1, /**< ... */``).
    """

    def __init__(self, text: str) -> None:
        comments: list[tuple[int, str]] = []

        def blank(m: re.Match[str]) -> str:
            s = m.group(0)
            if s[0] == "/":
                comments.append((m.start(), s))
                return re.sub(r"[^\n]", " ", s)
            return s[0] + " " * (len(s) - 2) + s[-1]

        code = _LEX_RE.sub(blank, text)
        self.code = _PP_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), code)
        self.newlines = [m.start() for m in re.finditer("\n", self.code)]
        self.leading: dict[int, str] = {}
        self.trailing: dict[int, str] = {}
        for start, s in comments:
            if self.code[self.code.rfind("\n", 0, start) + 1 : start].strip():
                self.trailing[self.line_of(start)] = s
            elif not s.lstrip("/*!").startswith("<") and (nxt := re.compile(r"\S").search(self.code, start)):
                self.leading[nxt.start()] = s  # the last comment before the code wins

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self.newlines, pos - 1) + 1

    def doc(self, pos: int, name: str, trailing: bool = False) -> str:
        """The doc line of what starts at ``pos``: its trailing comment (when asked), else its leading one."""
        comment = (self.trailing.get(self.line_of(pos), "") if trailing else "") or self.leading.get(pos, "")
        return "" if _GROUP_RE.search(comment) else _doc_line(comment, name)


def _doc_line(comment: str, name: str) -> str:
    """The first useful line of a doc comment: the ``\\brief`` sentence, else its first prose line."""
    lines = [re.sub(r"^\s*(?:/\*+!?<?|\*+/?|//[/!]?<?)?\s?", "", ln) for ln in comment.splitlines()]
    lines = [re.sub(r"\s*\*+/\s*$", "", ln).strip() for ln in lines]
    text = "\n".join(lines)
    if brief := re.search(r"[\\@]brief\s+(.*?)(?:\n\s*\n|\n\s*[\\@]|$)", text, re.S):
        line = " ".join(brief.group(1).split())
    else:
        para: list[str] = []
        for s in lines:
            if para and (not s or s.startswith(("\\", "@"))):
                break
            if s and not s.startswith(("\\", "@")) and f"{name}(" not in s.replace(" (", "("):
                para.append(s)
                if s.endswith("."):
                    break
        line = " ".join(para)
    return re.sub(r"[\\@](?:p|e|b|c|a)\s+", "", line).replace("::", "")[:200]


def _closing(code: str, open_pos: int) -> int:
    """The ``)`` or ``}`` closing the bracket at ``open_pos``; -1 if a ``;``, ``{`` or ``}`` comes first in ``(``."""
    opener = code[open_pos]
    closer, stops = (")", ";{}") if opener == "(" else ("}", "")
    depth = 0
    for m in re.compile("[" + re.escape(opener + closer + stops) + "]").finditer(code, open_pos):
        ch = m.group(0)
        if ch == opener:
            depth += 1
        elif ch == closer:
            depth -= 1
            if depth == 0:
                return m.start()
        else:
            return -1
    return -1


def _return_type(prefix: str) -> str | None:
    """What precedes a function's name with the macros dropped, or None if that cannot start a declaration."""
    p = _ACCESS_RE.sub(" ", _MACRO_CALL_RE.sub(" ", prefix))
    words = [w for w in p.split() if not _MACRO_RE.match(w)]
    idents = [w for w in re.findall(r"[A-Za-z_]\w*", p) if not _MACRO_RE.match(w)]
    if not idents or idents[0] in _BAD_START or not re.fullmatch(r"[\w\s*&:<>,]*", p) or p.rstrip().endswith("::"):
        return None
    return " ".join(_STORAGE_RE.sub(" ", " ".join(words)).split())


def _declaration_end(code: str, after_args: int) -> tuple[int, int]:
    """``(end of its qualifiers, end)`` of a declaration whose parameter list closes before ``after_args``;
    the end is -1 when what follows the list cannot end a declaration."""
    after = _TRAIL_RE.match(code, after_args).end()  # type: ignore[union-attr]  (it matches the empty string)
    nxt = code[after : after + 1]
    if nxt in (";", "="):  # a prototype, or = default / = delete
        return after, code.find(";", after)
    if nxt in ("{", ":"):  # a body, perhaps after a constructor's initialisers
        brace = code.find("{", after)
        return after, _closing(code, brace) if brace >= 0 else -1
    line_end = _LINE_END_RE.match(code, after_args)
    return after, line_end.end() - 1 if line_end else -1


def _aliases(name: str) -> list[str]:
    return [name, name[:-3]] if name.endswith("_v2") else [name]


def _functions(h: _Header, rel: str) -> list[Decl]:
    code = h.code
    out: list[Decl] = []
    pos = seg = 0  # seg: where the statement holding the candidate starts
    while (m := _CANDIDATE_RE.search(code, pos)) is not None:
        close = _closing(code, m.end() - 1)
        if close < 0:
            pos = seg = m.end()
            continue
        seg = max(seg, *(code.rfind(c, seg, m.start()) + 1 for c in ";{}"))
        name = m.group(1)
        if _MACRO_RE.match(name) or name in _DECORATIONS:
            pos = close + 1  # FOO(...) or __attribute__((...)): part of the prefix
            continue
        returns = _return_type(code[seg : m.start()]) if name not in _NOT_FUNCTIONS else None
        after, end = _declaration_end(code, close + 1) if returns is not None else (0, -1)
        if end < 0:
            pos = seg = close + 1
            continue
        start = seg + len(code[seg : m.start()]) - len(code[seg : m.start()].lstrip())
        args = re.sub(r"\b__dv\s*\(([^()]*)\)", r"= \1", " ".join(code[m.end() : close].split()))
        arrow = re.search(_ARROW, code[close + 1 : after])
        signature = " ".join(f"{returns} {name}({args}) {arrow.group(0) if arrow else ''}".split()) + ";"
        out.append(Decl(what="function", name=name, aliases=_aliases(name), signature=signature,
                        doc=h.doc(start, name), header=rel, line=h.line_of(start)))
        pos = seg = end + 1
    return out


def _enums(h: _Header, rel: str) -> list[Decl]:
    out: list[Decl] = []
    for m in _ENUM_RE.finditer(h.code):
        words = [w for w in m.group(1).split() if not w.startswith("__")]
        names = list(dict.fromkeys(n for n in (words[-1] if words else None, m.group(3)) if n))
        if not names:
            continue
        enum_name = names[-1]
        items: list[str] = []
        for em in _ENUMERATOR_RE.finditer(m.group(2)):
            item, value = em.group(1), " ".join((em.group(2) or "").split())
            at = m.start(2) + em.start(1)
            items.append(item)
            out.append(Decl(what="enumerator", name=item, aliases=[item],
                            signature=f"{item} = {value}  // enum {enum_name}" if value else f"{item}  // enum {enum_name}",
                            doc=h.doc(at, item, trailing=True), header=rel, line=h.line_of(at)))
        if items:
            shown = ", ".join(items[:40]) + (", ..." if len(items) > 40 else "")
            out.append(Decl(what="enum", name=enum_name, aliases=names, signature=f"enum {enum_name} {{ {shown} }};",
                            doc=h.doc(m.start(), enum_name), header=rel, line=h.line_of(m.start())))
    return out


def _typedefs(h: _Header, rel: str) -> list[Decl]:
    out = []
    for m in _TYPEDEF_RE.finditer(h.code):
        name = m.group(2)
        target = [w for w in m.group(1).split() if not w.startswith("__") and not _MACRO_RE.match(w)]
        if target and target != [name]:
            out.append(Decl(what="typedef", name=name, aliases=[name], signature=" ".join(m.group(0).split()),
                            doc=h.doc(m.start(), name), header=rel, line=h.line_of(m.start())))
    return out


def extract_header(path: Path, rel: str | None = None) -> list[Decl]:
    """Functions, enums, enumerators and typedefs declared in one header, each once."""
    h = _Header(Path(path).read_text(encoding="utf-8", errors="replace"))
    rel = rel or Path(path).name
    unique: dict[tuple[str, str], Decl] = {}
    for d in _functions(h, rel) + _enums(h, rel) + _typedefs(h, rel):
        unique.setdefault((d.name, d.signature), d)
    return list(unique.values())


_DECLS = TypeAdapter(list[Decl])


def load_decls(headers: Sequence[tuple[Path, str]], use_cache: bool = True) -> list[Decl]:
    """Declarations from ``headers``, read from the JSON cache when the headers are unchanged."""
    if not headers:
        return []
    key: list = [EXTRACTOR_VERSION] + [[str(p), rel, p.stat().st_size, p.stat().st_mtime_ns] for p, rel in headers]
    cache = cache_root() / "knowledge" / f"api-{hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]}.json"
    if use_cache and cache.is_file():
        try:
            data = json.loads(cache.read_text())
            if data.get("key") == key:
                return _DECLS.validate_python(data["decls"])
        except (OSError, ValueError, KeyError):
            pass  # unreadable or from another extractor: extract again
    decls = [d for path, rel in headers for d in extract_header(path, rel)]
    if use_cache:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": key, "decls": _DECLS.dump_python(decls)}))
            os.replace(tmp, cache)  # atomic: concurrent builders never read half a file
        except OSError:
            pass
    return decls
