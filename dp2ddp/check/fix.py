"""`check --fix` / `--diff`: the only place `check` parses LibCST.

The rules found their problems on the semantic model; their fixes are lazy
(``Fix(build=...)``). Here the file is parsed once with LibCST, a
:class:`~dp2ddp.model.bridge.Bridge` finds the LibCST node of every model node an edit
needs, and :func:`dp2ddp.engine.apply_edits` applies all edits in one pass. DDP001's fix
is the migration: what it says (DDP1xx warnings and errors, and the notes a selection asks
for) is reported as findings, and a file it refuses stays as it was.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from dp2ddp.check.analyze import candidates, check_source
from dp2ddp.check.cache import content_digest
from dp2ddp.check.noqa import suppressed
from dp2ddp.check.results import Diagnostic, diagnostic, migration_refused, only_lines, order
from dp2ddp.source import display_path


@dataclass
class Outcome:
    output: Optional[bytes] = None  # the fixed file (None: unchanged)
    fixed: int = 0
    diagnostics: List[Diagnostic] = field(default_factory=list)  # what is left (output) / what the migration said
    hidden: int = 0
    store: Optional[Tuple[Optional[str], Optional[List[Diagnostic]]]] = None
    blocked: bool = False
    error: Optional[str] = None


def apply_fixes(data: bytes, path: str, codes: Sequence[str], model, findings: list, lines: Optional[Set[int]]) -> Optional[Outcome]:
    """Fix ``findings`` (those that carry a fix) in ``data``; ``None`` when none does."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper

    from dp2ddp.engine import apply_edits, build_fixes, collect_edits
    from dp2ddp.model.bridge import Bridge, BridgeError
    from dp2ddp.rules.ddp001_data_parallel import MIGRATION
    from dp2ddp.source import InputError, Source, parse

    fixable = [f for f in findings if f.fixable]
    if not fixable:
        return None
    display = display_path(path)
    out = Outcome()
    try:
        module = parse(Source(path, data))
        bridge = Bridge(model, module)
        build_fixes(fixable, bridge)
    except InputError as e:
        out.error = f"{e} (LibCST, while fixing)"
        return out
    except BridgeError as e:
        out.error = f"{display}: fix not applied: {e}"
        return out
    said: List = []
    migration = model.cache.get(MIGRATION)
    if migration is not None:
        out.blocked = bool(migration.blocked)
        said = _selected(migration.findings, codes)
    done = [f for f in fixable if f.fix and f.fix.edits]
    edits = collect_edits(done)
    new = data
    if edits:
        try:
            new = apply_edits(MetadataWrapper(module, unsafe_skip_copy=True), edits, bridge.ancestors).bytes
            cst.parse_module(new)  # never write something that does not parse
            compile(new, display, "exec")
        except Exception as e:
            out.error = f"{display}: fix not applied, it would not produce valid Python ({type(e).__name__}: {e})"
            return out
    if new == data:
        out.diagnostics = _said(said, data, data, display, lines)
        return out
    if migration is not None and not migration.blocked:
        from dp2ddp.migrate import own_check

        own = own_check(new, path, data)  # a migration that fails the check is not written (as `rewrite` does)
        if own is not None:
            out.blocked = True
            refused = [own] + [f for f in migration.findings if f.severity != "info"]
            out.diagnostics = _said(_selected(refused, codes), data, data, display, lines)
            return out
    out.output = new
    out.fixed = len(done)
    # what is left: exactly what checking the new text reports (a fix may add code that
    # other rules look at: the migration adds DDP code), and what the migration said
    everything: List[Diagnostic] = []
    rules = candidates(new, codes)
    if rules:
        everything, _findings, again, error = check_source(new, path, rules)
        if again is not None:
            again.release()
        if error:
            out.error = error
            return out
    kept_lines = None if lines is None else _shifted(data, new, lines)
    left, out.hidden = only_lines(migration_refused(everything) if out.blocked else everything, kept_lines)
    out.diagnostics = sorted(left + _said(said, data, new, display, kept_lines), key=order)
    out.store = (content_digest(new), everything)
    return out


def _selected(findings, codes: Sequence[str]) -> list:
    """The migration's findings whose codes are selected (by default its warnings and errors)."""
    wanted = set(codes)
    return [f for f in findings if f.code in wanted]


def _said(findings, old: bytes, new: bytes, display: str, lines: Optional[Set[int]]) -> List[Diagnostic]:
    """The migration's findings as diagnostics, on the lines of ``new`` (positions move
    with the lines around them; ``# noqa`` is read there)."""
    from dp2ddp.registry import BY_CODE

    if not findings:
        return []
    moved = _line_map(old, new) if new != old else None
    new_lines = _lines(new if moved is not None else old)
    out = []
    for f in findings:
        d = diagnostic(display, f, BY_CODE[f.code].name if f.code in BY_CODE else "")
        d.fixable = False
        if moved is not None:
            shift = moved.get(d.line, d.line) - d.line
            d.line += shift
            d.end_line += shift
        text = new_lines[d.line - 1] if 0 < d.line <= len(new_lines) else ""
        if suppressed(d.code, text):
            continue
        if lines is not None and d.line not in lines:
            continue
        out.append(d)
    return out


def _lines(data: bytes) -> List[str]:
    """The lines of a file as Python counts them (``str.splitlines`` also splits at form
    feeds and other separators, which would shift every later line number)."""
    from dp2ddp.model.positions import LINE_BREAK

    return LINE_BREAK.split(data.decode("utf-8", "replace"))


def _line_map(old: bytes, new: bytes) -> Dict[int, int]:
    """Line of ``old`` -> the same line in ``new``, for the lines the fix left alone."""
    a, b = _lines(old), _lines(new)
    out: Dict[int, int] = {}
    for tag, i1, i2, j1, _j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                out[i1 + 1 + k] = j1 + 1 + k
    return out


def _shifted(old: bytes, new: bytes, lines: Set[int]) -> Set[int]:
    """Map kept line numbers of ``old`` to ``new`` (lines the fix added count as kept)."""
    a, b = _lines(old), _lines(new)
    out: Set[int] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            out.update(j1 + 1 + k for k in range(i2 - i1) if i1 + 1 + k in lines)
        else:
            out.update(range(j1 + 1, j2 + 1))
    return out
