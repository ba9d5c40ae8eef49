"""What the static checks found: the findings and what they read of the candidate on the way."""

from __future__ import annotations

from dataclasses import dataclass, field

from stitchcuda.verify.verdict import Finding


@dataclass
class StaticReport:
    findings: list[Finding] = field(default_factory=list)
    extensions: list[str] = field(default_factory=list)  # requested names of load_inline builds
    exported: list[str] = field(default_factory=list)  # functions the extensions export
    kernels: list[str] = field(default_factory=list)  # __global__ functions in the sources
    torch_ops_in_forward: list[str] = field(default_factory=list)
    libraries: list[str] = field(default_factory=list)

    def add(self, check: str, level: str, detail: str) -> None:
        if not any(f.check == check and f.detail == detail for f in self.findings):
            self.findings.append(Finding(check=check, level=level, detail=detail, source="static"))  # type: ignore[arg-type]
