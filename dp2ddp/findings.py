"""What rules and transforms report: :class:`Finding`, and its lazy :class:`Fix`.

Kept apart from :mod:`dp2ddp.engine` (which re-exports both) so that `dp2ddp check`, whose
rules detect on the semantic model, never imports LibCST unless it edits (``--fix``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, List, Optional


@dataclass
class Fix:
    """Edits against a LibCST tree. Detection runs on the semantic model (``ast``), where no
    LibCST node exists yet: such a fix carries ``build(bridge) -> edits``, called once the
    tree is parsed (:func:`build_fixes`), with a :class:`dp2ddp.model.bridge.Bridge` that
    finds the LibCST node of any model node."""

    edits: List[object] = field(default_factory=list)  # dp2ddp.engine.Edit
    description: str = ""
    build: Optional[Callable[..., List[object]]] = None

    def __bool__(self) -> bool:  # an empty fix is no fix
        return bool(self.edits) or self.build is not None


@dataclass
class Finding:
    code: str
    message: str
    node: Optional[object] = None  # a model (ast) node, or a LibCST node
    fix: Optional[Fix] = None
    line: int = 1
    col: int = 0  # 0-based, in characters; printers add 1
    severity: str = "warning"  # "warning" | "info" | "error"
    end_line: int = 0
    end_col: int = 0

    @property
    def fixable(self) -> bool:
        return bool(self.fix)


def build_fixes(findings: Iterable[Finding], bridge) -> None:
    """Turn every lazy fix into edits against ``bridge``'s tree (each fix once)."""
    seen: set = set()
    for f in findings:
        fix = f.fix
        if fix is not None and fix.build is not None and id(fix) not in seen:
            seen.add(id(fix))
            fix.edits = list(fix.build(bridge))
            fix.build = None
