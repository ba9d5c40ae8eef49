"""Building a candidate's CUDA: ``load_inline`` made safe to run many times, in parallel.

Candidates call ``torch.utils.cpp_extension.load_inline`` themselves, at import time. Inside
a worker process we replace that function with :meth:`ExtensionBuilder.load_inline`, which

- renames the extension to ``<requested name>_<source hash>`` and builds it in its own
  folder under the cache root, so two candidates never share a module name or a folder and
  an unchanged source is a cache hit;
- serialises builds of the same folder with an OS file lock and, while holding it, removes
  torch's own ``lock`` file, which a killed build leaves behind (torch's FileBaton would wait
  on it forever);
- adds ``-Xptxas -v`` and captures the compiler's whole output, so that errors keep their
  line numbers and the resource report (registers, spills, shared memory) can be parsed.

Only worker processes import candidates, so only they use this module's hook.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from stitchcuda import machine
from stitchcuda.verify.verdict import CompilerMessage, ExtensionBuild, KernelResources

REPORT_FILE = "stitchcuda_build.json"
_MAX_MESSAGES = 20
_LOG_TAIL_CHARS = 4000


class BuildFailed(RuntimeError):
    """A candidate's extension did not build; carries the parsed record."""

    def __init__(self, record: ExtensionBuild):
        first = record.messages[0] if record.messages else None
        where = f" ({first.file}:{first.line}: {first.message})" if first else ""
        super().__init__(f"building extension {record.requested_name!r} failed{where}")
        self.record = record


def _as_list(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def extension_key(**build_inputs: object) -> str:
    """A stable hash of everything that decides what a build produces."""
    import torch

    material = dict(build_inputs)
    material["torch"] = torch.__version__
    material["python"] = sys.version_info[:2]
    material["arch"] = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    blob = json.dumps(material, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _fds_to(log_path: Path) -> Iterator[None]:
    """Send this process's fd 1 and 2 (ninja, nvcc, ptxas write there) to a file."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "wb") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


# --- compiler output -----------------------------------------------------------------------

_NVCC_DIAG = re.compile(r"^(?P<file>\S+?)\((?P<line>\d+)\): (?P<sev>error|warning)(?: #[\w-]+)?: (?P<msg>.*)$")
_GCC_DIAG = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):(?:\d+:)? (?P<sev>fatal error|error|warning): (?P<msg>.*)$")
_LINK_DIAG = re.compile(r"(undefined reference to .*|cannot find -l\S+|undefined symbol: \S+|ptxas (?:error|fatal)\s*: .*)")
_OWN_FILES = ("main.cpp", "cuda.cu")


def parse_compiler_messages(log: str, build_dir: Path | None = None) -> list[CompilerMessage]:
    """Errors (and warnings in the candidate's own files) with line numbers, from a build log."""
    messages: list[CompilerMessage] = []
    seen: set[tuple[str, int | None, str]] = set()
    for raw in log.splitlines():
        line = raw.rstrip()
        match = _NVCC_DIAG.match(line) or _GCC_DIAG.match(line)
        if match:
            file = Path(match["file"]).name
            severity = "error" if "error" in match["sev"] else "warning"
            if severity == "warning" and file not in _OWN_FILES:
                continue  # warnings from torch's or CUDA's own headers are noise
            msg = CompilerMessage(file=file, line=int(match["line"]), severity=severity, message=match["msg"].strip())
        elif link := _LINK_DIAG.search(line):
            msg = CompilerMessage(file="link" if "ptxas" not in link[1] else "ptxas", message=link[1].strip())
        else:
            continue
        key = (msg.file, msg.line, msg.message)
        if key in seen:
            continue
        seen.add(key)
        if build_dir is not None and msg.line is not None and msg.file in _OWN_FILES:
            msg.source_line = _source_line(build_dir / msg.file, msg.line)
        messages.append(msg)
    messages.sort(key=lambda m: m.severity != "error")  # errors first, order otherwise kept
    return messages[:_MAX_MESSAGES]


def _source_line(path: Path, number: int) -> str | None:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    return lines[number - 1].strip() if 0 < number <= len(lines) else None


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPS = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[0\]")


def parse_ptxas_report(log: str) -> list[KernelResources]:
    """Per-kernel resources from ``-Xptxas -v`` output (entry functions only)."""
    kernels: dict[str, KernelResources] = {}
    current: KernelResources | None = None
    props_for: str | None = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = kernels.setdefault(m["name"], KernelResources(kernel=m["name"], arch=m["arch"]))
            continue
        if m := _PROPS.search(line):
            props_for = m["name"]
            continue
        if (m := _FRAME.search(line)) and props_for in kernels:
            k = kernels[props_for]
            k.stack_frame_bytes, k.spill_stores_bytes, k.spill_loads_bytes = (int(g) for g in m.groups())
            continue
        if current is not None and (m := _USED.search(line)):
            current.registers = int(m[1])
            if b := _BARRIERS.search(line):
                current.barriers = int(b[1])
            if s := _SMEM.search(line):
                current.shared_bytes = int(s[1])
            if c := _CMEM.search(line):
                current.constant_bytes = int(c[1])
    found = list(kernels.values())
    for k, readable in zip(found, demangle([k.kernel for k in found]), strict=True):
        k.kernel = readable
    return found


def demangle(names: list[str]) -> list[str]:
    """C++ names for mangled kernel symbols, through cu++filt or c++filt when present."""
    if not names:
        return names
    tool = machine.cuda_tool("cu++filt") or shutil.which("c++filt")
    if tool is None:
        return names
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return names
    readable = out.splitlines()
    return readable if len(readable) == len(names) else names


# --- the hook ---------------------------------------------------------------------------------

class ExtensionBuilder:
    """Replaces ``load_inline`` inside a worker and records every build it performs."""

    def __init__(self, cache_root: Path, candidate_source: str | None = None):
        self.builds_root = Path(cache_root) / "builds"
        self.candidate_source = candidate_source
        self.records: list[ExtensionBuild] = []
        self._original = None

    def install(self) -> None:
        from torch.utils import cpp_extension

        if cpp_extension.CUDA_HOME is None and (home := machine.cuda_home()):
            # A CPU-only torch can still compile CUDA (the link step needs a CUDA torch).
            cpp_extension.CUDA_HOME = home
        self._original = cpp_extension.load_inline
        cpp_extension.load_inline = self.load_inline

    def uninstall(self) -> None:
        from torch.utils import cpp_extension

        if self._original is not None:
            cpp_extension.load_inline = self._original

    def load_inline(
        self,
        name: str,
        cpp_sources: str | Sequence[str],
        cuda_sources: str | Sequence[str] | None = None,
        functions: str | Sequence[str] | dict | None = None,
        extra_cflags: Sequence[str] | None = None,
        extra_cuda_cflags: Sequence[str] | None = None,
        extra_ldflags: Sequence[str] | None = None,
        extra_include_paths: Sequence[str] | None = None,
        build_directory: str | None = None,  # ignored: every build gets its own folder
        verbose: bool = False,  # ignored: output is always captured
        **options: object,
    ):
        cpp = _as_list(cpp_sources)
        cuda = _as_list(cuda_sources)
        cuda_flags = list(extra_cuda_cflags or [])
        if cuda and "-Xptxas" not in " ".join(cuda_flags):
            cuda_flags += ["-Xptxas", "-v"]
        key = extension_key(
            name=name, cpp=cpp, cuda=cuda, functions=functions, cflags=extra_cflags, cuda_flags=cuda_flags,
            ldflags=extra_ldflags, include=extra_include_paths, options=options,
        )
        unique = f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}_{key[:16]}"
        build_dir = self.builds_root / unique
        build_dir.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        with _file_lock(build_dir / ".stitchcuda.lock"):
            # Holding our lock means no live build uses this folder: torch's lock is stale.
            (build_dir / "lock").unlink(missing_ok=True)
            saved = _read_report(build_dir)
            cache_hit = saved is not None and any(build_dir.glob(f"{unique}*.so"))
            log_path = build_dir / ("load.log" if cache_hit else "build.log")
            error: BaseException | None = None
            module = None
            with _fds_to(log_path):
                try:
                    # copies: load_inline inserts its include lines into the lists it is given
                    module = self._original(  # type: ignore[misc]
                        unique, cpp_sources=list(cpp), cuda_sources=list(cuda) or None, functions=functions,
                        extra_cflags=extra_cflags, extra_cuda_cflags=cuda_flags, extra_ldflags=extra_ldflags,
                        extra_include_paths=extra_include_paths, build_directory=str(build_dir), verbose=True,
                        **options,
                    )
                except Exception as exc:  # compiler, linker or import failure of the built module
                    error = exc
            log = log_path.read_text(errors="replace")
            record = ExtensionBuild(
                requested_name=name, name=unique, build_dir=str(build_dir), ok=error is None,
                cache_hit=cache_hit and error is None, seconds=round(time.perf_counter() - started, 3),
                log_tail=log[-_LOG_TAIL_CHARS:],
            )
            if error is None:
                record.kernels = saved.kernels if cache_hit and saved else parse_ptxas_report(log)
                if not cache_hit:
                    _write_report(build_dir, record)
            else:
                record.messages = parse_compiler_messages(log, build_dir)
                if self.candidate_source:
                    locate_in_candidate(record.messages, self.candidate_source, {"cuda.cu": cuda, "main.cpp": cpp},
                                        implicit_headers=not options.get("no_implicit_headers", False))
                if not any(m.severity == "error" for m in record.messages):
                    record.messages.insert(0, CompilerMessage(file="load_inline", message=_one_line(error)))
                record.log_tail = (log + f"\n{type(error).__name__}: {error}")[-_LOG_TAIL_CHARS:]
        self.records.append(record)
        if error is not None:
            raise BuildFailed(record) from error
        return module


# Lines load_inline writes before the candidate's own sources in each file it generates.
_PREAMBLE_LINES = {"cuda.cu": 3, "main.cpp": 1}


def locate_in_candidate(messages: list[CompilerMessage], candidate: str, sources: dict[str, list[str]],
                        implicit_headers: bool = True) -> None:
    """Map a line of a generated file (cuda.cu, main.cpp) to the line of the candidate's .py
    file it came from, when the source string appears there verbatim (as raw strings do)."""
    for msg in messages:
        parts = sources.get(msg.file)
        if not parts or msg.line is None:
            continue
        joined = "\n".join(parts)
        position = candidate.find(joined)
        line_in_source = msg.line - (_PREAMBLE_LINES[msg.file] if implicit_headers else 0)
        if position < 0 or not 0 < line_in_source <= joined.count("\n") + 1:
            continue
        msg.candidate_line = candidate.count("\n", 0, position) + line_in_source


def _one_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:500] if text else type(error).__name__


def _read_report(build_dir: Path) -> ExtensionBuild | None:
    try:
        return ExtensionBuild.model_validate_json((build_dir / REPORT_FILE).read_text())
    except (OSError, ValueError):
        return None


def _write_report(build_dir: Path, record: ExtensionBuild) -> None:
    tmp = build_dir / (REPORT_FILE + ".tmp")
    tmp.write_text(record.model_dump_json())
    tmp.replace(build_dir / REPORT_FILE)
