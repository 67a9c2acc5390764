"""Linting one file: gate, parse, model, rules, ``# noqa``, ``--new-only`` lines.

Nothing here imports torch or LibCST. Per file: read the bytes, ask each selected rule's
gate whether it could fire (most files stop here, unparsed), parse once with Python's
``ast``, build the :class:`~dp2ddp.model.core.SemanticModel`, run the candidate rules,
drop findings suppressed by ``# noqa`` or outside the lines ``--new-only`` keeps. With
``--fix``/``--diff``, :mod:`dp2ddp.lint_fix` turns the remaining fixes into edits (LibCST
only there). The rest of `check` lives beside this module: :mod:`dp2ddp.lint_pool` (many
files), :mod:`dp2ddp.lint_cache` (the result cache), :mod:`dp2ddp.lint_git`
(``--new-only``/``--since``), :mod:`dp2ddp.lint_noqa`, :mod:`dp2ddp.lint_output`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Dict, List, Optional, Sequence, Set, Tuple

from dp2ddp.lint_noqa import suppressed
from dp2ddp.source import display_path

# ---------------------------------------------------------------------------- results


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


# ---------------------------------------------------------------------------- rules and gates

_SELECTED: Dict[Tuple[str, ...], list] = {}


def selected_rules(codes: Sequence[str]) -> list:
    """The lint rules among ``codes`` (the migration's codes have no detection of their own)."""
    key = tuple(codes)
    got = _SELECTED.get(key)
    if got is None:
        from dp2ddp.rules import RULES

        wanted = set(codes)
        got = _SELECTED[key] = [r for r in RULES if r.code in wanted]
    return got


def candidates(data: bytes, codes: Sequence[str]) -> list:
    """The selected rules whose gate lets ``data`` through."""
    rules = selected_rules(codes)
    memo: dict = {}
    out = [r for r in rules if r.may_fire(data, memo)]
    if len(out) < len(rules) and not data.isascii():
        # Python reads identifiers NFKC-normalized: what the bytes did not show, the
        # normalized text may (only non-ASCII characters change)
        from dp2ddp.rules.base import gate_bytes

        gated, memo = gate_bytes(data), {}
        if gated is not None:
            out = [r for r in rules if r in out or r.may_fire(gated, memo)]
    return out


# ---------------------------------------------------------------------------- one file

CACHE = None  # the dp2ddp.lint_cache.ResultCache that lint_job consults (set by lint_pool.run_jobs)


def lint_job(job: Job) -> FileResult:
    from dp2ddp.source import InputError, read_source

    if job.data is None:
        try:
            data = read_source(job.path).data
        except InputError as e:
            return FileResult(job.path, error=str(e))
    else:
        data = job.data
    cache = CACHE
    digest = None
    if cache is not None:
        from dp2ddp.lint_cache import content_digest

        digest = content_digest(data)
        hit = cache.get(digest)
        # cached findings carry no fix: a file with something to fix is analysed again
        if hit is not None and not (job.fix and any(d[7] for d in hit)):
            return _from_cache(job.path, digest, hit, job.lines)
    result = lint_bytes(data, job.path, job.codes, lines=job.lines, fix=job.fix, write=job.write)
    if cache is None and result.store is not None:
        result.store = None
    elif result.store is not None and result.store[0] is None:
        result.store = (digest, result.store[1])
    return result


def _from_cache(path: str, digest: str, entry: List[tuple], lines: Optional[Set[int]]) -> FileResult:
    kept, hidden = only_lines([Diagnostic(display_path(path), *t) for t in entry], lines)
    result = FileResult(path, diagnostics=kept, hidden=hidden, cached=True)
    result.store = (digest, None)  # seen: keeps the entry alive, nothing new to store
    return result


def only_lines(diags: List[Diagnostic], lines: Optional[Set[int]]) -> Tuple[List[Diagnostic], int]:
    """The diagnostics on ``lines`` (all with ``None``), and how many were dropped."""
    if lines is None:
        return diags, 0
    kept = [d for d in diags if d.line in lines]
    return kept, len(diags) - len(kept)


def lint_bytes(
    data: bytes,
    path: str,
    codes: Sequence[str],
    lines: Optional[Set[int]] = None,
    fix: bool = False,
    write: bool = False,
) -> FileResult:
    """Lint one file's bytes. ``result.store`` holds what the result cache may keep for
    this content: every finding before ``lines`` filtered them (``None``: nothing)."""
    import gc

    # Python's ``ast`` builds hundreds of thousands of objects per big file; the cyclic GC
    # would rescan them at each of its collections. They die by reference counting when
    # the file is done (the model is released); what cycles are left are collected once
    # the GC is back on (lint_pool keeps it off for a whole run).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _lint_bytes(data, path, tuple(codes), lines, fix, write)
    finally:
        if enabled:
            gc.enable()


def _lint_bytes(data, path, codes, lines, fix, write) -> FileResult:
    result = FileResult(path)
    rules = candidates(data, codes)
    if not rules:
        result.store = (None, [])
        return result
    result.parsed = True
    everything, findings, model, error = check_source(data, path, rules)
    if error:
        result.error = error
        return result
    try:
        result = _results(result, data, path, codes, lines, fix, write, everything, findings, model)
        if model.star_imports:
            # a star import is resolved through the modules beside the file: its findings
            # depend on more than its bytes, so they are not cached
            result.store = None
        return result
    finally:
        model.release()  # freed now, not by the cyclic collector (off while checking)


def _results(result, data, path, codes, lines, fix, write, everything, findings, model) -> FileResult:
    if fix:
        from dp2ddp.lint_fix import apply_fixes

        kept = [f for f, d in zip(findings, everything) if lines is None or d.line in lines]
        outcome = apply_fixes(data, path, codes, model, kept, lines)
        if outcome is not None:
            result.blocked = outcome.blocked
            if outcome.error:
                result.error = outcome.error
                return result
            if outcome.output is not None:
                result.output, result.original, result.fixed = outcome.output, data, outcome.fixed
                result.diagnostics, result.hidden, result.store = outcome.diagnostics, outcome.hidden, outcome.store
                if write and path != "-":
                    from dp2ddp.source import atomic_write

                    atomic_write(path, outcome.output)
                return result
            # nothing changed (the migration refused the file): its findings, no longer
            # offered as fixable, and what the migration said
            diags, result.hidden = only_lines(everything, lines)
            if outcome.blocked:
                diags = migration_refused(diags)
            result.diagnostics = sorted(diags + outcome.diagnostics, key=_order)
            result.store = (None, everything)
            return result
    result.diagnostics, result.hidden = only_lines(everything, lines)
    result.store = (None, everything)
    return result


def migration_refused(diags: List[Diagnostic]) -> List[Diagnostic]:
    """Copies of ``diags`` in which DDP001 is no longer offered as fixable: the migration,
    its fix, refused the file. The originals stay as they are (the result cache keeps them)."""
    return [replace(d, fixable=False) if d.code == "DDP001" else d for d in diags]


def _order(d: Diagnostic):
    return (d.line, d.col, d.code)


def parse_model(data: bytes, path: str):
    """The semantic model of a file's bytes; a file that cannot be read as Python raises
    :class:`dp2ddp.source.InputError` with CPython's own message and line."""
    from dp2ddp.model.core import SemanticModel
    from dp2ddp.source import Source, parse_ast

    src = Source(path, data)
    tree, text = parse_ast(src)
    return SemanticModel(tree, text, src.display)


def check_source(data: bytes, path: str, rules: Sequence):
    """``(diagnostics, their findings, model, error)``: every finding of ``rules`` that
    no ``# noqa`` suppresses, in position order."""
    from dp2ddp.source import InputError

    display = display_path(path)
    try:
        model = parse_model(data, path)
    except InputError as e:
        return [], [], None, str(e)
    findings = []
    for rule in rules:
        try:
            findings.extend(rule.run(model))
        except RecursionError:
            return [], [], None, f"{display}: internal error in {rule.code}: file too deeply nested"
        except Exception as e:  # a bug in a rule must not stop the run; say which
            return [], [], None, f"{display}: internal error in {rule.code} ({type(e).__name__}: {e})"
    findings.sort(key=lambda f: (f.line, f.col, f.code))
    names = {r.code: r.name for r in rules}
    kept, out = [], []
    for f in findings:
        if suppressed(f.code, model.line_text(f.line)):
            continue
        kept.append(f)
        out.append(diagnostic(display, f, names.get(f.code, "")))
    return out, kept, model, None


def diagnostic(display: str, f, name: str) -> Diagnostic:
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
