"""Checking one file: read, result cache, findings, ``--new-only`` lines, fixes, write.

Nothing here imports torch; LibCST only through :mod:`dp2ddp.check.fix` (``--fix`` and
``--diff``). The findings come from :mod:`dp2ddp.check.analyze` (gate, parse, model,
rules, ``# noqa``). Many files go through :mod:`dp2ddp.check.pool`; the command that puts
it all together is :mod:`dp2ddp.check.command`.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Set

from dp2ddp.check.analyze import candidates, check_source
from dp2ddp.check.cache import ResultCache, content_digest
from dp2ddp.check.results import Diagnostic, FileResult, Job, migration_refused, only_lines, order
from dp2ddp.source import display_path

CACHE: Optional[ResultCache] = None  # the result cache check_job consults (set by pool.run_jobs)


def check_job(job: Job) -> FileResult:
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
        digest = content_digest(data)
        hit = cache.get(digest)
        # cached findings carry no fix: a file with something to fix is analysed again
        if hit is not None and not (job.fix and any(d[7] for d in hit)):
            return _from_cache(job.path, digest, hit, job.lines)
    result = check_bytes(data, job.path, job.codes, lines=job.lines, fix=job.fix, write=job.write)
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


def check_bytes(
    data: bytes,
    path: str,
    codes: Sequence[str],
    lines: Optional[Set[int]] = None,
    fix: bool = False,
    write: bool = False,
) -> FileResult:
    """Check one file's bytes. ``result.store`` holds what the result cache may keep for
    this content: every finding before ``lines`` filtered them (``None``: nothing)."""
    import gc

    # Python's ``ast`` builds hundreds of thousands of objects per big file; the cyclic GC
    # would rescan them at each of its collections. They die by reference counting when
    # the file is done (the model is released); what cycles are left are collected once
    # the GC is back on (the pool keeps it off for a whole run).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _check_bytes(data, path, tuple(codes), lines, fix, write)
    finally:
        if enabled:
            gc.enable()


def _check_bytes(data, path, codes, lines, fix, write) -> FileResult:
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
        from dp2ddp.check.fix import apply_fixes

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
            result.diagnostics = sorted(diags + outcome.diagnostics, key=order)
            result.store = (None, everything)
            return result
    result.diagnostics, result.hidden = only_lines(everything, lines)
    result.store = (None, everything)
    return result
