"""What a message suggests the user run next, as a record: the command and the options it names.

A hint is data, not prose, so that a test can hold every hint to the command line as it is: each
option a hint names exists on its command, and no hint offers ``--device cpu`` to a command that
needs a GPU (tests/test_hints.py). Messages render hints with :func:`render`; ``--json`` errors
carry them as records.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class Hint(BaseModel):
    command: str = Field(description="the stitchcuda command, e.g. verify; 'dataset build' for a subcommand")
    options: list[str] = Field([], description="what to add to it, each an option with its value, e.g. "
                                               "'--device cpu'; arguments in capitals are the user's to fill in")
    why: str = Field(description="what it does for the user")

    def line(self) -> str:
        return f"`stitchcuda {' '.join([self.command, *self.options])}`: {self.why}"

    def flags(self) -> list[str]:
        """The option names this hint uses (``--device`` of ``--device cpu``)."""
        return [o.split()[0].split("=")[0] for o in self.options if o.startswith("-")]


# commands that cannot do their job without a CUDA GPU: no hint offers them the CPU
GPU_ONLY = frozenset({"profile"})

DOCTOR = Hint(command="doctor", why="what this machine can do (GPU, nvcc, headers, torch)")
VERIFY_ON_CPU = Hint(command="verify", options=["REFERENCE", "CANDIDATE", "--device cpu"],
                     why="checks a pure-PyTorch or C++ (non-CUDA) candidate on the CPU")
VERIFY_STATIC = Hint(command="verify", options=["REFERENCE", "CANDIDATE", "--static-only"],
                     why="the hacking checks alone: nothing built or run, no GPU needed")
OPTIMIZE_OFFLINE = Hint(command="optimize", options=["REFERENCE", "--coder offline"],
                        why="the LLM-free Coder writes the program here and compile-checks it with nvcc; "
                            "verifying it needs a GPU")
REWARD_FROM_VERDICT = Hint(command="reward", options=["REFERENCE", "CANDIDATE", "--verdict FILE"],
                           why="the reward from an earlier verification (`stitchcuda verify ... --json > FILE`)")
BENCH_ON_RAY = Hint(command="bench", options=["SUITE", "--ray ADDRESS"], why="runs the bench on a Ray cluster's GPUs")
BENCH_ON_CPU = Hint(command="bench", options=["SUITE", "--gpus cpu"],
                    why="C++-only debugging on the CPU (candidates without CUDA)")
BENCH_SKIP_UNUSABLE = Hint(command="bench", options=["SUITE", "--skip-unusable"],
                           why="runs the usable tasks and leaves these out")
TASKS_CHECK = Hint(command="tasks", options=["SPEC", "--check"], why="checks every task of a folder, file by file")
NARROW_KERNELBENCH = Hint(command="tasks", options=["--kernelbench PATH", "--level N"],
                          why="lists the problems; pick one with --problem ID")
OPTIMIZE_WITH_LLM = Hint(command="optimize", options=["REFERENCE", "--model NAME", "--base-url URL"],
                         why="an LLM Coder (any OpenAI-compatible server, e.g. vLLM) can write what the "
                             "offline compiler does not support")
OPTIMIZE_RESUME = Hint(command="optimize", options=["--resume RUN"], why="continues a stopped run; nothing "
                                                                        "verified is redone")

# what each command suggests when it finds no GPU
NO_GPU: dict[str, list[Hint]] = {
    "verify": [VERIFY_ON_CPU, VERIFY_STATIC, DOCTOR],
    "optimize": [OPTIMIZE_OFFLINE, DOCTOR],
    "profile": [DOCTOR],
    "reward": [REWARD_FROM_VERDICT, DOCTOR],
    "bench": [BENCH_ON_RAY, BENCH_ON_CPU, DOCTOR],
}

CATALOGUE: list[Hint] = [DOCTOR, VERIFY_ON_CPU, VERIFY_STATIC, OPTIMIZE_OFFLINE, REWARD_FROM_VERDICT,
                         BENCH_ON_RAY, BENCH_ON_CPU, BENCH_SKIP_UNUSABLE, TASKS_CHECK, NARROW_KERNELBENCH,
                         OPTIMIZE_WITH_LLM, OPTIMIZE_RESUME]


def render(hints: list[Hint]) -> str:
    """The hints as lines under a message, for the terminal."""
    return "".join(f"\n  try {h.line()}" for h in hints)
