"""A small local retrieval index: our technique notes plus API declarations from the CUDA headers.

Two corpora, each an SQLite FTS5 table with its own BM25 statistics:

- ``note``: the Markdown notes in ``notes/`` split at their ``##`` headings, one document per section;
- ``api``: function declarations, enums, enumerators and typedefs read from the CUDA toolkit headers
  found on this machine (plus a few torch headers that extensions use: streams, BLAS handles), each
  with the first line of its doc comment (see ``headers.py``).

FTS5 ranks with ``bm25()`` (column weights make a note's title and heading, and a declaration's names,
count more than body text) and stems with its ``porter`` tokenizer. What it cannot do is split
identifiers, so :func:`tokenize` does that before any text reaches it: ``cublasLtMatmulDescSetAttribute``
becomes the whole name plus ``cublas lt matmul desc set attribute``, and both "matmul desc attribute"
and the exact name match.

Scores are normalised per query: bm25 over the best score a document could reach for the query in that
corpus (every term present, term frequency unbounded), so hits of the two corpora merge on one scale
in (0, 1].
"""

from __future__ import annotations

import difflib
import functools
import math
import re
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from stitchcuda.agents.knowledge.headers import Decl, find_headers, load_decls

NOTES_DIR = Path(__file__).parent / "notes"

Kind = Literal["note", "api"]


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
# Tokeniser: identifier splitting, the one thing FTS5's tokenizers do not do


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_WORD_RE = re.compile(r"[A-Za-z0-9_]+")
_PART_RE = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
# Dropped from documents and queries alike: an nvcc log or a sentence would otherwise OR them in.
_STOP = _words(
    "a an and are as at be by can do does for from how i if in into is it its of on or so that the "
    "then this to use used using we what when where which with without you your"
)
# Abbreviations in API names, spelt out the way notes and queries write them.
_SYNONYMS = {"shfl": "shfl shuffle", "cublaslt": "cublas lt", "sgemm": "sgemm gemm", "bmm": "bmm batch matmul"}


@functools.lru_cache(maxsize=65536)
def _word_terms(word: str) -> tuple[str, ...]:
    parts = [p.lower() for p in _PART_RE.findall(word)]
    whole = word.strip("_").lower()
    out = [whole] if len(parts) > 1 and whole else []
    for part in parts:
        if part not in _STOP and (len(part) > 1 or part.isdigit()):
            out.extend(_SYNONYMS.get(part, part).split())
    return tuple(out)


def tokenize(text: str) -> list[str]:
    """Lower-case words as FTS5 receives them; an identifier gives itself and its parts (FTS5 stems them)."""
    return [term for word in _WORD_RE.findall(text) for term in _word_terms(word)]


# ---------------------------------------------------------------------------------------------------
# FTS5

# FTS5's bm25() has k1 = 1.2 and b = 0.75 built in; the normalisation below needs its k1.
_K1 = 1.2
# Absolute paths in a build log (the extension's build folder, torch_extensions/py311_cu124/...) say
# nothing about the error and would outweigh its message; relative ones (torch/extension.h) stay.
_ABS_PATH_RE = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+[\w.+-]*")
# '_' inside a token keeps a whole identifier (shfl_down, load_inline) one term.
_TOKENIZER = "porter unicode61 tokenchars '_'"


def _connect() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", check_same_thread=False)
    try:
        db.execute("CREATE VIRTUAL TABLE temp.probe USING fts5(x)")
    except sqlite3.OperationalError as err:
        raise RuntimeError(
            f"this Python's SQLite {sqlite3.sqlite_version} has no FTS5, which the knowledge search needs: "
            "use a CPython or conda build (both ship FTS5), or run with the knowledge search off"
        ) from err
    return db


class _Table:
    """One corpus as an FTS5 table, ranked by bm25() with per-column weights; row ``i`` is document ``i``."""

    def __init__(self, db: sqlite3.Connection, name: str, weights: dict[str, float],
                 rows: Iterable[Sequence[str]]) -> None:
        self.db, self.name = db, name
        cols = ", ".join(weights)
        db.execute(f"CREATE VIRTUAL TABLE {name} USING fts5({cols}, tokenize=\"{_TOKENIZER}\")")
        db.executemany(
            f"INSERT INTO {name}(rowid, {cols}) VALUES (?{', ?' * len(weights)})",
            ((i, *(" ".join(tokenize(text)) for text in row)) for i, row in enumerate(rows)),
        )
        # the column weights become the table's rank, so a query just orders by it
        db.execute(f"INSERT INTO {name}({name}, rank) VALUES ('rank', ?)",
                   (f"bm25({', '.join(str(w) for w in weights.values())})",))
        self.n = db.execute(f"SELECT count(*) FROM {name}").fetchone()[0]

    def _idf(self, term: str) -> float:
        hits = self.db.execute(f"SELECT count(*) FROM {self.name}(?)", (f'"{term}"',)).fetchone()[0]
        idf = math.log((self.n - hits + 0.5) / (hits + 0.5))
        return idf if idf > 0 else 1e-6  # the floor FTS5 applies to terms in over half the rows

    def search(self, terms: Sequence[str], limit: int) -> list[tuple[int, float]]:
        """``(row, score in (0, 1])``, best first, for documents holding any of ``terms``."""
        if not terms or not self.n:
            return []
        rows = self.db.execute(f"SELECT rowid, rank FROM {self.name}(?) ORDER BY rank LIMIT ?",
                               (" OR ".join(f'"{t}"' for t in terms), limit)).fetchall()
        best = (_K1 + 1.0) * sum(self._idf(t) for t in terms)
        return [(i, min(1.0, -rank / best)) for i, rank in rows]


# ---------------------------------------------------------------------------------------------------
# Documents


@dataclass(frozen=True)
class _Doc:
    kind: Kind
    title: str
    source: str
    text: str
    names: tuple[str, ...]  # identifiers an exact lookup should find (api docs)
    fields: tuple[str, ...]  # what the FTS5 table indexes, one text per column


# A note's own title counts twice and its section heading twice (the body repeats it once more); a
# declaration's names twice (its signature repeats them), so an exact name outranks a mention.
_NOTE_WEIGHTS = {"title": 2.0, "tags": 1.0, "heading": 2.0, "body": 1.0}
_API_WEIGHTS = {"names": 2.0, "signature": 1.0, "doc": 1.0}


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
            fields = (note.title, " ".join(note.tags), heading, body)
            docs.append(_Doc("note", title, source, body, (), fields))
    return docs


def _api_doc(d: Decl) -> _Doc:
    text = d.signature + (f"\n// {d.doc}" if d.doc else "")
    return _Doc("api", d.name, f"{d.header}:{d.line}", text, tuple(d.aliases), (" ".join(d.aliases), d.signature, d.doc))


# ---------------------------------------------------------------------------------------------------
# Compiler errors

_API_NAME = (
    r"(?:cublasLt|cublas|cudnn|cuda|cufft|curand|cusparse|cusolver|nvrtc|nvtx|cu)[A-Z]\w*"
    r"|(?:CUBLASLT|CUBLAS|CUDNN|CUDA|CUFFT|CURAND|NVRTC|CU)_[A-Z0-9_]+"
    r"|__[a-z][a-z0-9_]*[a-z0-9](?<!__)\b"
    r"|getCurrentCUDA\w*|getDefaultCUDAStream|getStreamFromPool|getCudnnHandle|getCUDABlasLt\w*"
    r"|atomic(?:Add|Sub|Exch|Min|Max|Inc|Dec|CAS|And|Or|Xor)\w*"
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
    """Notes and header declarations, searchable with FTS5; build with :meth:`default` or :meth:`build`."""

    def __init__(self, notes: Sequence[Note], api_docs: Sequence[Decl], headers: Sequence[Path] = ()) -> None:
        self.notes = list(notes)
        self.headers = list(headers)
        self._docs: dict[Kind, list[_Doc]] = {
            "note": _note_docs(self.notes),
            "api": [_api_doc(d) for d in api_docs],
        }
        db = _connect()
        self._lock = threading.Lock()  # one connection, shared by the agents' threads
        self._tables = {
            "note": _Table(db, "note", _NOTE_WEIGHTS, (d.fields for d in self._docs["note"])),
            "api": _Table(db, "api", _API_WEIGHTS, (d.fields for d in self._docs["api"])),
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
        return cls(load_notes(notes_dir), load_decls(headers, use_cache), [p for p, _ in headers])

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
        terms = list(dict.fromkeys(tokenize(_ABS_PATH_RE.sub(" ", query))))
        kinds: tuple[Kind, ...] = (kind,) if kind else ("note", "api")
        ranked: list[tuple[float, Kind, int]] = []
        with self._lock:
            for kd in kinds:
                ranked.extend((score, kd, i) for i, score in self._tables[kd].search(terms, k * (per_note + 3)))
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
