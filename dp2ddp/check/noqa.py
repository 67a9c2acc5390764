"""``# noqa`` comments: ``# noqa`` silences every finding on its line, ``# noqa: DDP001,
DDP105`` the named codes (lint rules and migration codes alike)."""

from __future__ import annotations

import re
from typing import Optional, Set

_NOQA = re.compile(
    r"#\s*noqa(?::[ \t]*(?P<codes>[A-Za-z]+[0-9]+(?:[ \t]*,?[ \t]*[A-Za-z]+[0-9]+)*))?", re.IGNORECASE
)


def noqa_codes(line: str) -> Optional[Set[str]]:
    """``None``: no noqa; empty set: a bare ``# noqa``; else the codes."""
    m = None
    for m in _NOQA.finditer(line):
        pass
    if m is None:
        return None
    codes = m.group("codes")
    if not codes:
        return set()
    return {c.upper() for c in re.findall(r"[A-Za-z]+[0-9]+", codes)}


def suppressed(code: str, line_text: str) -> bool:
    if "noqa" not in line_text and "NOQA" not in line_text.upper():
        return False
    codes = noqa_codes(line_text)
    if codes is None:
        return False
    return not codes or code in codes
