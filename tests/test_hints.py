"""Hints are true: every option a hint names exists on the command it names, and no hint offers
the CPU to a command that needs a GPU."""

from __future__ import annotations

from typer.main import get_command

from stitchcuda.cli import app
from stitchcuda.hints import CATALOGUE, GPU_ONLY, NO_GPU, Hint, render


def _command(path: str):
    command = get_command(app)
    for part in path.split():
        command = command.commands[part]  # a KeyError names a hint's command that does not exist
    return command


def _options(path: str) -> set[str]:
    return {name for param in _command(path).params for name in getattr(param, "opts", [])
            if name.startswith("-")}


def test_every_hint_names_a_real_command_and_its_real_options():
    hints = {h.line(): h for h in [*CATALOGUE, *(h for hs in NO_GPU.values() for h in hs)]}
    for hint in hints.values():
        missing = set(hint.flags()) - _options(hint.command)
        assert not missing, f"{hint.line()} names {missing}, which `stitchcuda {hint.command}` does not have"


def test_no_hint_offers_the_cpu_to_a_gpu_only_command():
    for command in GPU_ONLY:
        for hint in [*CATALOGUE, *NO_GPU.get(command, [])]:
            if hint.command == command:
                assert "--device cpu" not in " ".join(hint.options) and "--gpus cpu" not in " ".join(hint.options)


def test_each_gpu_command_has_its_no_gpu_hints_and_they_stay_on_it_or_doctor():
    assert set(NO_GPU) == {"verify", "optimize", "profile", "reward", "bench"}
    for command, hints in NO_GPU.items():
        assert all(h.command in (command, "doctor") for h in hints), command


def test_the_check_itself_catches_an_option_that_does_not_exist():
    wrong = Hint(command="profile", options=["--static-only"], why="a hint that points nowhere")
    assert set(wrong.flags()) - _options("profile") == {"--static-only"}


def test_rendered_hints_name_the_command_line():
    text = render(NO_GPU["verify"])
    assert "stitchcuda verify REFERENCE CANDIDATE --static-only" in text and "stitchcuda doctor" in text

