"""What checking a file produces: :class:`Diagnostic` (one finding as printed),
:class:`FileResult` (one file), and :class:`Job` (what to do with one file).

Plain data, no imports from the rest of `check`: every other module of the package reads
these, so this one reads none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import List, Optional, Set, Tuple


@dataclass
class Diagnostic:
    path: str
    line: int  # 1-based
    col: int  # 1-based
    end_line: int
    end_col: int
    code: str
    name: str
    message: str
    fixable: bool = False
    severity: str = "warning"


@dataclass
class FileResult:
    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    error: Optional[str] = None  # "path:line: message" for unreadable / unparsable input
    parsed: bool = False
    fixed: int = 0  # number of findings fixed
    output: Optional[bytes] = None  # new contents when fixes changed the file
    hidden: int = 0  # findings dropped because they are on unchanged lines (--new-only)
    original: Optional[bytes] = None  # kept for --diff
    cached: bool = False  # the findings came from the result cache
    blocked: bool = False  # --fix: the migration (DDP001's fix) refused the file
    # for the result cache: (content digest, every finding of that content, before --new-only)
    store: Optional[Tuple[Optional[str], Optional[List[Diagnostic]]]] = None


@dataclass
class Job:
    path: str
    codes: Tuple[str, ...]  # the selected codes (lint rules and migration codes)
    lines: Optional[Set[int]] = None  # --new-only: the added lines (None: all)
    fix: bool = False  # compute fixes
    write: bool = False  # write fixed files (atomic)
    data: Optional[bytes] = None  # content, when already read (stdin)


def diagnostic(display: str, f, name: str) -> Diagnostic:
    """A :class:`dp2ddp.findings.Finding` as printed (1-based columns)."""
    end_line, end_col = (f.end_line, f.end_col) if f.end_line else (f.line, f.col)
    return Diagnostic(
        path=display,
        line=f.line,
        col=f.col + 1,
        end_line=end_line,
        end_col=end_col + 1,
        code=f.code,
        name=name,
        message=f.message,
        fixable=f.fixable,
        severity=f.severity,
    )


def only_lines(diags: List[Diagnostic], lines: Optional[Set[int]]) -> Tuple[List[Diagnostic], int]:
    """The diagnostics on ``lines`` (all with ``None``), and how many were dropped."""
    if lines is None:
        return diags, 0
    kept = [d for d in diags if d.line in lines]
    return kept, len(diags) - len(kept)


def migration_refused(diags: List[Diagnostic]) -> List[Diagnostic]:
    """Copies of ``diags`` in which DDP001 is no longer offered as fixable: the migration,
    its fix, refused the file. The originals stay as they are (the result cache keeps them)."""
    return [replace(d, fixable=False) if d.code == "DDP001" else d for d in diags]


def order(d: Diagnostic):
    return (d.line, d.col, d.code)
