"""The one Jinja2 setup for every template the package ships: prompts, CUDA and Python sources, reports."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import jinja2


@functools.cache
def environment(folder: Path, **filters: Callable) -> jinja2.Environment:
    """The templates under ``folder``, with ``filters`` added to Jinja's own; one per folder.

    An undefined name is an error, never an empty string. A block tag takes the newline after it
    and the indent before it (``trim_blocks``, ``lstrip_blocks``), so a template lays its output
    out line by line; ``+%}`` keeps the newline where a tag ends a line of output. Files keep
    their last newline. Only ``*.html.j2`` templates are HTML-escaped; prompts and code are not.
    """
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default=False,
                                            default_for_string=False),
    )
    env.filters.update(filters)
    return env
