"""Checking many files: in a pool of processes when there are enough of them to pay."""

from __future__ import annotations

import os
import sys
from typing import List, Optional, Tuple

from dp2ddp.check import engine
from dp2ddp.check.analyze import selected_rules
from dp2ddp.check.cache import ResultCache
from dp2ddp.check.results import FileResult, Job


def _worker_init(parent: int, cache: Optional[ResultCache] = None) -> None:
    import signal

    import gc

    engine.CACHE = cache  # already there after fork; pickled once per worker with spawn
    gc.disable()  # as in the parent: each file's objects die by reference counting

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and reaps us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:  # die with the parent even if it is killed with SIGKILL
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # pragma: no cover - no prctl
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def run_jobs(jobs: List[Job], processes: Optional[int] = None, cache: Optional[ResultCache] = None) -> List[FileResult]:
    """Check all jobs; in a process pool when there are enough files for it to pay. With
    ``cache``, files whose content is in it are not analysed, and the new results are
    stored when all jobs are done."""
    import gc

    engine.CACHE = cache
    enabled = gc.isenabled()
    gc.disable()  # every file's objects die by reference counting (see engine.check_bytes)
    try:
        results = _run_jobs(jobs, processes, cache)
    finally:
        engine.CACHE = None
        if enabled:
            gc.enable()
    if cache is not None:
        cache.save(results)
    return results


def _run_jobs(jobs: List[Job], processes: Optional[int], cache: Optional[ResultCache]) -> List[FileResult]:
    if processes is None:
        processes = min(os.cpu_count() or 1, 8)
    if processes <= 1 or len(jobs) < 16 or any(j.data is not None for j in jobs):
        return [engine.check_job(j) for j in jobs]
    import multiprocessing as mp

    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    # import the rules and the model before forking so every worker inherits them
    selected_rules(jobs[0].codes)
    import dp2ddp.model.core  # noqa: F401
    import signal

    def _on_term(signum, frame):  # turn SIGTERM into an exception so the pool is reaped
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _on_term) if _main_thread() else None
    pool = ctx.Pool(processes, initializer=_worker_init, initargs=(os.getpid(), cache))
    try:
        results: List[Optional[FileResult]] = [None] * len(jobs)
        for batch in pool.imap_unordered(_batch_jobs, _batches(jobs, processes), chunksize=1):
            for i, result in batch:
                results[i] = result
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return results


def _batches(jobs: List[Job], processes: int) -> List[List[Tuple[int, Job]]]:
    """Biggest files first, each big file alone (a 10,000-line file drawn last would keep
    one worker busy while the others idle), the many small ones in batches of about the
    same size (one message to a worker and one back per batch, not per file: most files
    of a large tree are only read and gated)."""
    sizes = [_size(j.path) for j in jobs]
    order = sorted(range(len(jobs)), key=lambda i: -sizes[i])
    share = max(sum(sizes) // (processes * 16), 1)
    out: List[List[Tuple[int, Job]]] = []
    batch: List[Tuple[int, Job]] = []
    held = 0
    for i in order:
        batch.append((i, jobs[i]))
        held += sizes[i]
        if held >= share:
            out.append(batch)
            batch, held = [], 0
    if batch:
        out.append(batch)
    return out


def _batch_jobs(batch: List[Tuple[int, Job]]) -> List[Tuple[int, FileResult]]:
    return [(i, engine.check_job(job)) for i, job in batch]


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


