"""Snippets the migration inserts, kept as real Python files so they read like code.

Each ``*.py.tmpl`` file uses ``str.format`` fields (``{dist}``, ``{torch}`` ...) for the
local names the target script binds; ``launch/`` holds the Jinja launch templates.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import List

import libcst as cst


@lru_cache(maxsize=None)
def load(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def render_statements(name: str, module: cst.Module, **values: str) -> List[cst.BaseStatement]:
    """Render template ``name`` and parse it into statements that use ``module``'s
    indentation and newline style."""
    text = load(name).format(**values)
    if module.default_newline != "\n":
        text = text.replace("\n", module.default_newline)
    if module.default_indent != "    ":
        text = "\n".join(_reindent(line, module.default_indent) for line in text.split("\n"))
    parsed = cst.parse_module(text)
    body = list(parsed.body)
    # a comment at the top of a template is parsed into the module header: keep it with
    # the first statement so it travels with the inserted code
    if body and parsed.header:
        body[0] = body[0].with_changes(leading_lines=list(parsed.header) + list(body[0].leading_lines))
    return body


def _reindent(line: str, indent: str) -> str:
    stripped = line.lstrip(" ")
    depth = (len(line) - len(stripped)) // 4
    return indent * depth + stripped
