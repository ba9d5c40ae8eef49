"""A small local retrieval index: our technique notes plus API declarations from the CUDA headers.

Two corpora, each ranked with its own BM25 statistics:

- ``note``: the Markdown notes in ``notes/`` split at their ``##`` headings, one document per section;
- ``api``: function declarations, enums, enumerators and typedefs read from the CUDA toolkit headers
  found on this machine (plus a few torch headers that extensions use: streams, BLAS handles), each
  with the first line of its doc comment.

Scores are normalised per query (BM25 divided by the best score a document could reach for the query
in that corpus) so hits from the two corpora can be merged. The header corpus is cached as JSON under
``stitchcuda.paths.cache_root()``, keyed by the header paths, sizes and mtimes.

The tokeniser splits camelCase and snake_case identifiers and keeps the whole identifier as well, so
``cublasLtMatmulDescSetAttribute`` matches both "matmul desc attribute" and its exact name.
"""

from __future__ import annotations

import bisect
import difflib
import functools
import hashlib
import json
import math
import os
import re
import shutil
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel

from stitchcuda.paths import cache_root

NOTES_DIR = Path(__file__).parent / "notes"
EXTRACTOR_VERSION = 3

Kind = Literal["note", "api"]

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


class Hit(BaseModel):
    """One retrieved document: a note section or an API declaration."""

    kind: Kind
    title: str
    source: str
    text: str
    score: float


class Note(BaseModel):
    """One technique note as shipped in ``notes/``."""

    name: str
    title: str
    tags: list[str]
    text: str


# ---------------------------------------------------------------------------------------------------
# Tokeniser


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_WORD_RE = re.compile(r"[A-Za-z0-9_]+")
_PART_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_STOP = _words(
    "a an and are as at be by can do does for from how i if in into is it its of on or so that the "
    "then this to use used using we what when where which with without you your"
)
_SUFFIXES = (
    ("ations", ""),
    ("ation", ""),
    ("tions", ""),
    ("tion", ""),
    ("ings", ""),
    ("ing", ""),
    ("ies", "y"),
    ("ied", "y"),
    ("ed", ""),
    ("es", ""),
    ("e", ""),
    ("s", ""),
)
_SYNONYMS = {"shfl": "shuffl", "cublaslt": "cublas lt", "sgemm": "sgemm gemm", "bmm": "bmm batch matmul"}


def _stem(word: str) -> str:
    word = re.sub(r"iz(?=e|ed|es|ing|ation)", "is", word)
    for suffix, replacement in _SUFFIXES:
        if not word.endswith(suffix):
            continue
        if suffix == "s" and word[-2:-1] in ("s", "u", "i", "a"):
            return word
        stem = word[: len(word) - len(suffix)] + replacement
        return stem if len(stem) >= 3 else word
    return word


@functools.lru_cache(maxsize=65536)
def _word_tokens(word: str) -> tuple[str, ...]:
    parts = [p.lower() for p in _PART_RE.findall(word)]
    out: list[str] = []
    whole = word.strip("_").lower()
    if len(parts) > 1 and whole:
        out.append(whole)
    for part in parts:
        if part in _STOP or (len(part) < 2 and not part.isdigit()):
            continue
        stem = part if part.isdigit() else _stem(part)
        out.extend(_SYNONYMS.get(stem, stem).split())
    return tuple(out)


def tokenize(text: str) -> list[str]:
    """Lower-case, stemmed terms; identifiers give their parts and themselves."""
    out: list[str] = []
    for word in _WORD_RE.findall(text):
        out.extend(_word_tokens(word))
    return out


# ---------------------------------------------------------------------------------------------------
# BM25


class _Bm25:
    """Okapi BM25 over pre-tokenised documents; scores are normalised to the query's best possible."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.n = len(docs)
        lengths = np.array([len(d) for d in docs], dtype=np.float64)
        self.norm = k1 * (1.0 - b + b * lengths / max(float(lengths.mean()) if self.n else 1.0, 1e-9))
        ids: dict[str, list[int]] = {}
        tfs: dict[str, list[int]] = {}
        for i, doc in enumerate(docs):
            for term, tf in Counter(doc).items():
                ids.setdefault(term, []).append(i)
                tfs.setdefault(term, []).append(tf)
        self._ids, self._tfs = ids, tfs
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def idf(self, term: str) -> float:
        df = len(self._ids.get(term, ()))
        return math.log(1.0 + (self.n - df + 0.5) / (df + 0.5))

    def has(self, term: str) -> bool:
        return term in self._ids

    def scores(self, terms: Sequence[str]) -> np.ndarray:
        """Scores in [0, 1]: BM25 over the query's best possible (every term present, tf large)."""
        out = np.zeros(self.n, dtype=np.float64)
        terms = list(dict.fromkeys(terms))
        if not terms or not self.n:
            return out
        best = 0.0
        for term in terms:
            idf = self.idf(term)
            best += idf * (self.k1 + 1.0)
            if term not in self._ids:
                continue
            if term not in self._arrays:
                self._arrays[term] = (
                    np.asarray(self._ids[term], dtype=np.int64),
                    np.asarray(self._tfs[term], dtype=np.float64),
                )
            ids, tf = self._arrays[term]
            out[ids] += idf * tf * (self.k1 + 1.0) / (tf + self.norm[ids])
        return out / best if best > 0 else out


# ---------------------------------------------------------------------------------------------------
# Notes


@dataclass(frozen=True)
class _Doc:
    kind: Kind
    title: str
    source: str
    text: str
    names: tuple[str, ...]  # identifiers an exact lookup should find (api docs)
    terms: tuple[str, ...]


def _parse_note(path: Path) -> Note:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    title = next((ln[2:].strip() for ln in lines if ln.startswith("# ")), "")
    tags_line = next((ln for ln in lines[:5] if ln.lower().startswith("tags:")), "")
    tags = [t.strip() for t in tags_line.split(":", 1)[1].split(",")] if tags_line else []
    return Note(name=path.stem, title=title, tags=[t for t in tags if t], text=text)


def load_notes(folder: Path = NOTES_DIR) -> list[Note]:
    """Every ``*.md`` note in ``folder``, sorted by file name."""
    return [_parse_note(p) for p in sorted(Path(folder).glob("*.md"))]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _note_docs(notes: Iterable[Note]) -> list[_Doc]:
    docs: list[_Doc] = []
    for note in notes:
        head = f"{note.title} {' '.join(note.tags)}"
        sections: list[tuple[str, list[str]]] = [("", [])]
        for line in note.text.splitlines():
            if line.startswith("## "):
                sections.append((line[3:].strip(), [line]))
            elif not line.startswith("# ") and not line.lower().startswith("tags:"):
                sections[-1][1].append(line)
        for heading, body_lines in sections:
            body = "\n".join(body_lines).strip()
            if not body:
                continue
            title = f"{note.title} / {heading}" if heading else note.title
            source = f"notes/{note.name}.md" + (f"#{_slug(heading)}" if heading else "")
            terms = tokenize(f"{head} {heading} {heading} {body}") + tokenize(note.title)
            docs.append(_Doc("note", title, source, body, (), tuple(terms)))
    return docs


# ---------------------------------------------------------------------------------------------------
# Header discovery


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
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            add(Path(os.environ[var]) / "include")
    nvcc = shutil.which("nvcc")
    if nvcc:
        add(Path(nvcc).parent.parent / "include")
        add(Path(nvcc).resolve().parent.parent / "include")
    add("/usr/local/cuda/include")
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
    import importlib.util

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
# Header extraction

_LEX_RE = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
_PP_RE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_CAND_RE = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_MACRO_RE = re.compile(r"^_*[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)*_*$")
_MACRO_CALL_RE = re.compile(
    r"\b(?:_*[A-Z][A-Z0-9_]*|__attribute__|__declspec|alignas|__align__)\s*\((?:[^()]|\([^()]*\))*\)"
)
_ACCESS_RE = re.compile(r"\b(?:public|private|protected)\s*:(?!:)")
_ARROW = r"->\s*(?:decltype\s*\((?:[^()]|\([^()]*\))*\)|[\w:\*&<> ]+)"
_TRAIL_RE = re.compile(
    rf"(?:\s*(?:const|noexcept|override|final|volatile|throw\s*\(\s*\)|{_ARROW}|_*[A-Z][A-Z0-9_]*\b))*\s*"
)
_TRAIL_LINE_RE = re.compile(
    r"(?:[ \t]*(?:const|noexcept|override|final|throw\s*\(\s*\)|_*[A-Z][A-Z0-9_]*\b))*[ \t]*(?:\n|$)"
)
_NOT_FUNCTIONS = _words(
    "if for while switch return sizeof alignof decltype static_assert operator catch defined typeid "
    "new delete throw noexcept case do else using typedef template requires namespace __dv "
    "__attribute__ __declspec alignas __align__ __launch_bounds__"
)
_BAD_START = _words("return if else while for switch case do goto throw new delete using typedef namespace")
_DISPLAY_DROP = re.compile(
    r"\b(?:extern|static|inline|__inline__|__forceinline__|__cudart_builtin__|__device_builtin__|friend)\b"
)
_ENUM_RE = re.compile(
    r"\benum\b(?:\s+(?:class|struct)\b)?((?:\s+[A-Za-z_]\w*)*)\s*(?::\s*[\w\s:]+?)?\s*\{([^{}]*)\}\s*([A-Za-z_]\w*)?"
)
_TYPEDEF_RE = re.compile(r"\btypedef\s+([^;{}()]+?)[\s\*]+([A-Za-z_]\w*)\s*;")


def _balanced(code: str, open_pos: int, opener: str, closer: str, stops: str = "") -> int:
    """Index of the bracket closing the one at ``open_pos``, or -1 (also on a stop character)."""
    depth = 0
    pattern = re.compile("[" + re.escape(opener + closer + stops) + "]")
    for m in pattern.finditer(code, open_pos):
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


def _doc_line(comment: str, name: str) -> str:
    """The first useful line of a doc comment: the ``\\brief`` sentence, else its first prose line."""
    body = re.sub(r"^/\*+!?<?|\*+/$|^//[/!]?<?", "", comment.strip())
    lines = [re.sub(r"^\s*(?:\*+|//[/!]?<?)?\s?", "", ln).rstrip() for ln in body.splitlines()]
    text = "\n".join(lines)
    brief = re.search(r"[\\@]brief\s+(.*?)(?:\n\s*\n|\n\s*[\\@]|$)", text, re.S)
    if brief:
        line = " ".join(brief.group(1).split())
    else:
        para: list[str] = []
        for ln in lines:
            s = ln.strip()
            if para and (not s or s.startswith(("\\", "@"))):
                break
            if not s or s.startswith(("\\", "@")) or f"{name}(" in s.replace(" (", "("):
                continue
            para.append(s)
            if s.endswith("."):
                break
        line = " ".join(para)
    line = re.sub(r"[\\@](?:p|e|b|c|a)\s+", "", line).replace("::", "")
    return line[:200]


class _Source:
    """A header's code with comments, strings and preprocessor lines blanked (offsets preserved)."""

    def __init__(self, text: str) -> None:
        self.comments: list[tuple[int, int, str]] = []

        def blank(m: re.Match[str]) -> str:
            s = m.group(0)
            if s.startswith("/"):
                self.comments.append((m.start(), m.end(), s))
                return re.sub(r"[^\n]", " ", s)
            return s[0] + " " * (len(s) - 2) + s[-1]

        code = _LEX_RE.sub(blank, text)
        self.code = _PP_RE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), code)
        self.comment_ends = [c[1] for c in self.comments]
        self.newlines = [m.start() for m in re.finditer("\n", self.code)]

    def line_of(self, pos: int) -> int:
        return bisect.bisect_right(self.newlines, pos - 1) + 1

    def comment_before(self, pos: int, not_before_line: int = 0) -> str:
        i = bisect.bisect_right(self.comment_ends, pos) - 1
        if i < 0 or self.code[self.comments[i][1] : pos].strip():
            return ""
        start, _, text = self.comments[i]
        if text.lstrip("/*!").startswith("<") or self.line_of(start) < not_before_line:
            return ""
        if re.search(r"[\\@](?:defgroup|addtogroup|name)\b|@\{|@\}", text):
            return ""
        parts = [text]
        while text.startswith("//") and i > 0:  # a block of // lines reads as one comment
            prev = self.comments[i - 1]
            if not prev[2].startswith("//") or self.code[prev[1] : self.comments[i][0]].strip():
                break
            i -= 1
            parts.insert(0, prev[2])
            text = prev[2]
        return "\n".join(parts)

    def comment_after(self, pos: int) -> str:
        """A comment that starts on the same line after ``pos`` (a trailing member comment)."""
        i = bisect.bisect_right(self.comment_ends, pos)
        if i < len(self.comments):
            start, _, text = self.comments[i]
            if start >= pos and "\n" not in self.code[pos:start]:
                return text
        return ""


def _display(prefix: str, name: str, args: str) -> str:
    prefix = _MACRO_CALL_RE.sub(" ", prefix)
    prefix = _ACCESS_RE.sub(" ", prefix)
    words = [w for w in prefix.split() if not _MACRO_RE.match(w)]
    prefix = _DISPLAY_DROP.sub(" ", " ".join(words))
    args = re.sub(r"\b__dv\s*\(([^()]*)\)", r"= \1", args)
    return " ".join(f"{prefix} {name}({args})".split())


def _valid_prefix(prefix: str) -> bool:
    p = _MACRO_CALL_RE.sub(" ", prefix)
    p = _ACCESS_RE.sub(" ", p)
    words = [w for w in re.findall(r"[A-Za-z_]\w*", p) if not _MACRO_RE.match(w)]
    if not words or words[0] in _BAD_START:
        return False
    return re.fullmatch(r"[\w\s\*&:<>,]*", p) is not None and "::" not in p.strip()[-2:]


def _aliases(name: str) -> tuple[str, ...]:
    if name.endswith("_v2"):
        return (name, name[:-3])
    return (name,)


def _functions(src: _Source, rel: str) -> list[dict]:
    code = src.code
    docs: list[dict] = []
    pos = seg = 0
    while (m := _CAND_RE.search(code, pos)) is not None:
        close = _balanced(code, m.end() - 1, "(", ")", ";{}")
        if close < 0:
            pos = seg = m.end()
            continue
        name = m.group(1)
        boundary = max(
            code.rfind(";", seg, m.start()), code.rfind("{", seg, m.start()), code.rfind("}", seg, m.start())
        )
        if boundary >= 0:
            seg = boundary + 1
        if _MACRO_RE.match(name) or name in ("__attribute__", "__declspec", "alignas", "__align__", "__dv"):
            pos = close + 1  # a decoration: part of the prefix
            continue
        prefix = code[seg : m.start()]
        if name in _NOT_FUNCTIONS or not _valid_prefix(prefix):
            pos = seg = close + 1
            continue
        trail = _TRAIL_RE.match(code, close + 1)
        after = trail.end() if trail else close + 1
        nxt = code[after : after + 1]
        end = -1
        if nxt in (";", "="):
            end = code.find(";", after)
        elif nxt in ("{", ":"):
            brace = code.find("{", after)
            end = _balanced(code, brace, "{", "}") if brace >= 0 else -1
        else:
            line_trail = _TRAIL_LINE_RE.match(code, close + 1)
            if line_trail:
                end = line_trail.end() - 1
        if end < 0:
            pos = seg = close + 1
            continue
        start = seg + len(prefix) - len(prefix.lstrip())
        args = " ".join(code[m.end() : close].split())
        arrow = re.search(_ARROW, code[close + 1 : after])
        returns = " " + " ".join(arrow.group(0).split()) if arrow else ""
        doc = _doc_line(src.comment_before(start), name)
        docs.append(
            {
                "what": "function",
                "name": name,
                "aliases": list(_aliases(name)),
                "signature": _display(prefix, name, args) + returns + ";",
                "doc": doc,
                "header": rel,
                "line": src.line_of(start),
            }
        )
        pos = seg = end + 1
    return docs


def _enums(src: _Source, rel: str) -> list[dict]:
    docs: list[dict] = []
    for m in _ENUM_RE.finditer(src.code):
        words = [w for w in m.group(1).split() if not w.startswith("__")]
        names = [n for n in (words[-1] if words else None, m.group(3)) if n]
        if not names:
            continue
        enum_name = names[-1]
        body_start = m.start(2)
        items: list[str] = []
        prev_line = src.line_of(m.start(2))
        offset = 0
        for part in m.group(2).split(","):
            part_pos = body_start + offset
            offset += len(part) + 1
            stripped = part.strip()
            em = re.match(r"([A-Za-z_]\w*)[^=]*(?:=\s*(.*))?$", stripped, re.S)
            if not em:
                continue
            item = em.group(1)
            value = " ".join((em.group(2) or "").split())
            item_pos = part_pos + len(part) - len(part.lstrip())
            comma = part_pos + len(part)
            comment = src.comment_after(comma + 1) or src.comment_before(
                item_pos, not_before_line=prev_line + 1
            )
            if not comment:  # a trailing comment of the last item (no comma after it)
                comment = src.comment_after(part_pos + len(part.rstrip()))
            prev_line = src.line_of(comma)
            items.append(item)
            signature = f"{item} = {value}" if value else item
            docs.append(
                {
                    "what": "enumerator",
                    "name": item,
                    "aliases": [item],
                    "signature": f"{signature}  // enum {enum_name}",
                    "doc": _doc_line(comment, item) if comment else "",
                    "header": rel,
                    "line": src.line_of(item_pos),
                }
            )
        if items:
            shown = ", ".join(items[:40]) + (", ..." if len(items) > 40 else "")
            docs.append(
                {
                    "what": "enum",
                    "name": enum_name,
                    "aliases": list(dict.fromkeys(names)),
                    "signature": f"enum {enum_name} {{ {shown} }};",
                    "doc": _doc_line(src.comment_before(m.start()), enum_name),
                    "header": rel,
                    "line": src.line_of(m.start()),
                }
            )
    return docs


def _typedefs(src: _Source, rel: str) -> list[dict]:
    docs = []
    for m in _TYPEDEF_RE.finditer(src.code):
        name = m.group(2)
        target = " ".join(w for w in m.group(1).split() if not w.startswith("__") and not _MACRO_RE.match(w))
        if not target or target == name:
            continue
        docs.append(
            {
                "what": "typedef",
                "name": name,
                "aliases": [name],
                "signature": f"typedef {' '.join(m.group(0)[len('typedef') :].split())}",
                "doc": _doc_line(src.comment_before(m.start()), name),
                "header": rel,
                "line": src.line_of(m.start()),
            }
        )
    return docs


def extract_header(path: Path, rel: str | None = None) -> list[dict]:
    """Functions, enums, enumerators and typedefs declared in one header, as plain dicts."""
    src = _Source(Path(path).read_text(encoding="utf-8", errors="replace"))
    rel = rel or Path(path).name
    docs = _functions(src, rel) + _enums(src, rel) + _typedefs(src, rel)
    seen: set[tuple[str, str]] = set()
    out = []
    for d in docs:
        key = (d["name"], d["signature"])
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _cache_file(headers: Sequence[tuple[Path, str]]) -> tuple[Path, list]:
    key = [EXTRACTOR_VERSION]
    for path, rel in headers:
        st = path.stat()
        key.append([str(path), rel, st.st_size, st.st_mtime_ns])
    digest = hashlib.sha1(json.dumps(key).encode()).hexdigest()[:16]
    return cache_root() / "knowledge" / f"api-{digest}.json", key


def load_api_docs(headers: Sequence[tuple[Path, str]], use_cache: bool = True) -> list[dict]:
    """Declarations from ``headers``, read from the JSON cache when the headers are unchanged."""
    if not headers:
        return []
    cache, key = _cache_file(headers)
    if use_cache and cache.is_file():
        try:
            data = json.loads(cache.read_text())
            if data.get("key") == key:
                return data["docs"]
        except (OSError, ValueError, KeyError):
            pass
    docs: list[dict] = []
    for path, rel in headers:
        docs.extend(extract_header(path, rel))
    if use_cache:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": key, "docs": docs}))
            os.replace(tmp, cache)
        except OSError:
            pass
    return docs


def _api_doc(d: dict) -> _Doc:
    text = d["signature"] + (f"\n// {d['doc']}" if d.get("doc") else "")
    name_terms = tokenize(" ".join(d["aliases"]))
    terms = name_terms * 2 + tokenize(d["signature"]) + tokenize(d.get("doc", ""))
    return _Doc("api", d["name"], f"{d['header']}:{d['line']}", text, tuple(d["aliases"]), tuple(terms))


# ---------------------------------------------------------------------------------------------------
# Compiler errors

_API_NAME = (
    r"(?:cublasLt|cublas|cudnn|cuda|cufft|curand|cusparse|cusolver|nvrtc|nvtx|cu)[A-Z]\w*"
    r"|(?:CUBLASLT|CUBLAS|CUDNN|CUDA|CUFFT|CURAND|NVRTC|CU)_[A-Z0-9_]+"
    r"|__[a-z][a-z0-9_]*[a-z0-9](?<!__)\b"
    r"|getCurrentCUDA\w*|getDefaultCUDAStream|getStreamFromPool|getCudnnHandle|getCUDABlasLt\w*"
)
_API_RE = re.compile(rf"(?<![\w/.-])(?:{_API_NAME})(?![\w]|\.h)")
_QUALIFIED_RE = re.compile(r"\b(?:cg|cooperative_groups|wmma|at::cuda|c10::cuda|at::native)::([A-Za-z_]\w*)")
_ERROR_LINE_RE = re.compile(r"error|undefined reference|undefined symbol|not declared|no matching", re.I)
_DIAG_START_RE = re.compile(r"^\S+(?:\(\d+\)|:\d+:)|^\s*(?:FAILED|ninja|/usr/bin/ld|collect2)", re.I)
_KEYWORDS = _words(
    "__global__ __device__ __host__ __shared__ __constant__ __restrict__ __launch_bounds__ "
    "__forceinline__ __noinline__ __managed__ __grid_constant__ __align__ __inline__"
)


def _demangled_parts(symbol: str) -> list[str]:
    """Identifier pieces of an Itanium-mangled symbol (``_ZN2at4cuda20getCurrentCUDAStreamEa``)."""
    parts, i = [], 0
    while (m := re.compile(r"(\d+)([A-Za-z_])").search(symbol, i)) is not None:
        n = int(m.group(1))
        piece = symbol[m.start(2) : m.start(2) + n]
        if n > 0 and len(piece) == n and re.fullmatch(r"[A-Za-z_]\w*", piece):
            parts.append(piece)
            i = m.start(2) + n
        else:
            i = m.start(2)
    return parts


def _raw_identifiers(text: str) -> list[str]:
    lines = text.splitlines()
    primary: list[str] = []
    context: list[str] = []
    for i, line in enumerate(lines):
        if not _ERROR_LINE_RE.search(line) or line.lstrip().startswith(("FAILED", "ninja:")):
            continue
        found = list(_API_RE.findall(line)) + _QUALIFIED_RE.findall(line)
        for sym in re.findall(r"\b_Z\w+", line):
            found.extend(p for p in _demangled_parts(sym) if _API_RE.fullmatch(p))
        primary.extend(found)
        for follow in lines[i + 1 : i + 3]:  # nvcc echoes the offending source line under the message
            if _DIAG_START_RE.search(follow) or not follow.strip() or follow.strip() == "^":
                break
            context.extend(_API_RE.findall(follow) + _QUALIFIED_RE.findall(follow))
    out = [x for x in dict.fromkeys(primary + context) if x not in _KEYWORDS]
    return out


# ---------------------------------------------------------------------------------------------------
# The knowledge base


class KnowledgeBase:
    """Notes and header declarations, searchable with BM25; build with :meth:`default` or :meth:`build`."""

    def __init__(self, notes: Sequence[Note], api_docs: Sequence[dict], headers: Sequence[Path] = ()) -> None:
        self.notes = list(notes)
        self.headers = list(headers)
        self._docs: dict[Kind, list[_Doc]] = {
            "note": _note_docs(self.notes),
            "api": [_api_doc(d) for d in api_docs],
        }
        # Note sections carry their note's title and tags, so length normalisation is kept mild.
        self._bm25 = {
            "note": _Bm25([d.terms for d in self._docs["note"]], b=0.3),
            "api": _Bm25([d.terms for d in self._docs["api"]], b=0.75),
        }
        self._by_name: dict[str, list[int]] = {}
        for i, doc in enumerate(self._docs["api"]):
            for name in doc.names:
                self._by_name.setdefault(name, []).append(i)
        for idx in self._by_name.values():  # fp32 overloads first (the shuffles, __ldg, ...)
            idx.sort(key=lambda i: not re.search(r"\bfloat\b", self._docs["api"][i].text.split("\n", 1)[0]))
        note_names = set()
        for note in self.notes:
            note_names.update(_API_RE.findall(note.text))
            note_names.update(_QUALIFIED_RE.findall(note.text))
        self._note_names = note_names - _KEYWORDS
        self._lower: dict[str, str] = {}
        for name in sorted(self._note_names) + list(self._by_name):
            self._lower.setdefault(name.lower(), name)

    # construction ------------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        notes_dir: Path = NOTES_DIR,
        include_dirs: Sequence[Path] | None = None,
        use_cache: bool = True,
        torch_headers: bool = True,
    ) -> KnowledgeBase:
        headers = find_headers(include_dirs, torch_headers=torch_headers)
        return cls(load_notes(notes_dir), load_api_docs(headers, use_cache), [p for p, _ in headers])

    @classmethod
    def default(cls) -> KnowledgeBase:
        """The shipped notes plus this machine's headers; built once per process."""
        return _default_kb()

    # queries -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return sum(len(d) for d in self._docs.values())

    def size(self) -> dict[str, int]:
        return {kind: len(docs) for kind, docs in self._docs.items()}

    def api_names(self) -> list[str]:
        return list(self._by_name)

    def is_known(self, name: str) -> bool:
        return name in self._by_name or name in self._note_names

    def search(self, query: str, k: int = 5, kind: Kind | None = None, per_note: int = 2) -> list[Hit]:
        """The ``k`` best documents for ``query``; at most ``per_note`` sections of one note."""
        terms = tokenize(query)
        kinds: tuple[Kind, ...] = (kind,) if kind else ("note", "api")
        ranked: list[tuple[float, Kind, int]] = []
        for kd in kinds:
            scores = self._bm25[kd].scores(terms)
            if not len(scores):
                continue
            top = np.argsort(-scores, kind="stable")[: max(k * (per_note + 3), k)]
            ranked.extend((float(scores[i]), kd, int(i)) for i in top if scores[i] > 0)
        ranked.sort(key=lambda t: -t[0])
        hits: list[Hit] = []
        per: Counter[str] = Counter()
        for score, kd, i in ranked:
            doc = self._docs[kd][i]
            note_file = doc.source.split("#", 1)[0]
            if kd == "note" and per[note_file] >= per_note:
                continue
            per[note_file] += 1
            hits.append(self._hit(doc, score))
            if len(hits) >= k:
                break
        return hits

    def closest_api_names(self, name: str, n: int = 3, cutoff: float = 0.75) -> list[str]:
        """Real names (headers, then notes) closest to a possibly misspelt ``name``."""
        low = name.lower()
        pool = [
            c for c in self._lower if c[:3] == low[:3] and abs(len(c) - len(low)) <= max(3, len(low) // 4)
        ]
        return [self._lower[c] for c in difflib.get_close_matches(low, pool, n=n, cutoff=cutoff) if c != low]

    def lookup_api(self, identifiers: Sequence[str], k: int = 8, per_name: int = 3) -> list[Hit]:
        """Header declarations for ``identifiers``: exact names first, then near names, then notes."""
        exact: list[Hit] = []
        near: list[Hit] = []
        notes: list[Hit] = []
        seen: set[str] = set()

        def take(idx: list[int], score: float, into: list[Hit]) -> None:
            for i in idx[:per_name]:
                doc = self._docs["api"][i]
                if doc.source not in seen:
                    seen.add(doc.source)
                    into.append(self._hit(doc, score))

        for ident in identifiers:
            name = ident.split("::")[-1]
            if name in self._by_name:
                take(self._by_name[name], 1.0, exact)
                continue
            for close in self.closest_api_names(name):
                if close in self._by_name:
                    ratio = difflib.SequenceMatcher(None, name.lower(), close.lower()).ratio()
                    take(self._by_name[close], round(0.9 * ratio, 4), near)
            for hit in self.search(name, k=1, kind="note"):
                if hit.source not in seen and name.lower() in hit.text.lower():
                    seen.add(hit.source)
                    notes.append(hit.model_copy(update={"score": round(0.5 * hit.score, 4)}))
        return (exact + near + notes)[:k]

    def identifiers_in_compiler_error(self, text: str) -> list[str]:
        """API-looking identifiers named by nvcc/gcc/ld errors, each unknown one followed by near names."""
        out: list[str] = []
        for ident in _raw_identifiers(text):
            if ident not in out:
                out.append(ident)
            if not self.is_known(ident):
                out.extend(c for c in self.closest_api_names(ident) if c not in out)
        return out

    def _hit(self, doc: _Doc, score: float) -> Hit:
        return Hit(kind=doc.kind, title=doc.title, source=doc.source, text=doc.text, score=round(score, 4))


@functools.lru_cache(maxsize=1)
def _default_kb() -> KnowledgeBase:
    return KnowledgeBase.build()


def identifiers_in_compiler_error(text: str, kb: KnowledgeBase | None = None) -> list[str]:
    """API-looking identifiers in compiler/linker error text; misspelt ones come with the closest real names."""
    return (kb or KnowledgeBase.default()).identifiers_in_compiler_error(text)


def format_hits(hits: Sequence[Hit], max_chars: int = 4000) -> str:
    """Hits as Markdown for a prompt, cut to ``max_chars`` (whole hits first, then a cut last one)."""
    blocks: list[str] = []
    used = 0
    for hit in hits:
        if hit.kind == "api":
            block = f"### {hit.title}  ({hit.source})\n```cpp\n{hit.text}\n```"
        else:
            block = f"### {hit.title}  ({hit.source})\n{hit.text}"
        sep = 2 if blocks else 0
        if used + sep + len(block) <= max_chars:
            blocks.append(block)
            used += sep + len(block)
            continue
        room = max_chars - used - sep - len("\n```\n[...]")
        if room >= 200 and hit.kind == "note":
            cut = block[:room]
            cut = cut[: cut.rfind("\n")] if "\n" in cut else cut
            if cut.count("```") % 2:
                cut += "\n```"
            blocks.append(cut + "\n[...]")
        break
    return "\n\n".join(blocks)
