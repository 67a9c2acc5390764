"""An inference-only pair of runs: no optimizer step in either, so no loss or replica to
compare. What such a script gives its user is what it prints (and the files it writes,
which :mod:`dp2ddp.verify.outputs` compares as for any run): the original's standard
output is compared with the migration's rank 0's, line by line.

The probe keeps what each process prints (``stdout`` in its end record, up to
``STDOUT_KEEP`` characters). A line that differs between the original and the envelope run
(the same original run again) is noise of the run itself (a time, a speed, a path under a
scratch folder) and is not compared; the report says how many such lines there were. A
migrated rank other than 0 that prints lines too is noted (each rank's print of the same
result), not failed.

The work is judged too: the probe counts the samples each process ran its model on in
outermost module calls (``forwards`` in its end record). A migration whose every rank ran
it on all the samples the original did repeats the whole inference on each process: N
times the work, which fails (``infer_ddp.py``-shaped hand migrations); shares that add up
to the original's are noted.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from dp2ddp.verify.runner import RunResult


def _printed(run: Optional[RunResult], rank: int = 0) -> Optional[str]:
    if run is None:
        return None
    r = run.ranks.get(rank)
    end = r.end if r is not None else None
    if not end or "stdout" not in end:
        return None
    return str(end["stdout"])


def _cut(run: RunResult) -> bool:
    return any((r.end or {}).get("stdout_cut") for r in run.ranks.values())


def _short(line: str) -> str:
    return line if len(line) <= 120 else line[:117] + "..."


def judge(orig: RunResult, mig: RunResult, envelope: Optional[RunResult], evaluation_whole: bool = False) -> Dict[str, Any]:
    """``agree``: the migration's rank 0 printed the original's lines (noise lines aside);
    ``problems``/``notes`` for the report; ``lines``/``noise``: the counts compared.
    ``evaluation_whole``: the migration trains, and this run is its evaluation-only mode,
    whose evaluation runs whole on every rank by ``rewrite``'s default (DDP108): a note."""
    problems: List[str] = []
    notes: List[str] = []
    o, m = _printed(orig), _printed(mig)
    if o is None or m is None:
        problems.append("inference only (no optimizer step in either run), and the probe did not record what "
                        f"the {'original' if o is None else 'migrated'} run printed: nothing to compare")
        return {"agree": False, "problems": problems, "notes": notes, "lines": 0, "noise": 0}
    lo, lm = o.splitlines(), m.splitlines()
    if _cut(orig) or _cut(mig):
        n = min(len(lo), len(lm))
        lo, lm = lo[:n], lm[:n]
        notes.append(f"inference only: the runs printed more than the probe keeps; the first {n} lines are compared")
    e = _printed(envelope)
    le = e.splitlines() if e is not None else None
    noise = {i for i, (a, b) in enumerate(zip(lo, le)) if a != b} if le is not None and len(le) == len(lo) else set()
    if not lo:
        problems.append("inference only (no optimizer step in either run), and the original printed nothing: there is "
                        "no result to compare (the files the runs wrote are compared below, if any)")
        return {"agree": False, "problems": problems, "notes": notes, "lines": 0, "noise": 0}
    if len(lo) != len(lm):
        i = next((k for k, (a, b) in enumerate(zip(lo, lm)) if a != b and k not in noise), min(len(lo), len(lm)))
        a = _short(lo[i]) if i < len(lo) else "(nothing)"
        b = _short(lm[i]) if i < len(lm) else "(nothing)"
        problems.append(f"inference only: the original printed {len(lo)} lines, the migration's rank 0 {len(lm)}; "
                        f"line {i + 1}: original `{a}`, migrated `{b}`")
    else:
        bad = [k for k, (a, b) in enumerate(zip(lo, lm)) if a != b and k not in noise]
        if bad:
            i = bad[0]
            problems.append(f"inference only: {len(bad)} of the {len(lo)} lines printed differ; line {i + 1}: original "
                            f"`{_short(lo[i])}`, migrated rank 0 `{_short(lm[i])}`")
    agree = not problems
    if agree:
        shown = f" ({len(noise)} that differ between two runs of the original, such as times, not compared)" if noise else ""
        notes.append(f"inference only (no optimizer step in either run): the migration's rank 0 printed the original's "
                     f"{len(lo)} line{'s' if len(lo) != 1 else ''}, line for line{shown}")
    _judge_work(orig, mig, problems, notes, evaluation_whole)
    agree = agree and not problems
    others = [r for r in sorted(mig.ranks) if r != 0 and (_printed(mig, r) or "").strip()]
    if others:
        notes.append(f"inference only: rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} printed too "
                     "(every rank prints its copy of the results)")
    return {"agree": agree, "problems": problems, "notes": notes, "lines": len(lo), "noise": len(noise)}


def _forwarded(run: RunResult) -> Dict[int, int]:
    return {rank: int(((r.end or {}).get("forwards") or {}).get("samples") or 0)
            for rank, r in sorted(run.ranks.items()) if r.end and "forwards" in r.end}


def _judge_work(orig: RunResult, mig: RunResult, problems: List[str], notes: List[str], evaluation_whole: bool = False) -> None:
    o, m = _forwarded(orig), _forwarded(mig)
    total = sum(o.values())
    if not total or len(m) < 2:
        return
    shares = ", ".join(f"rank {r}: {n}" for r, n in m.items())
    repeated = all(n >= total for n in m.values())
    if repeated and evaluation_whole:
        notes.append(f"inference only in this run, of a migration that trains: every rank ran the model on all {total} "
                     f"samples ({shares}), as `dp2ddp rewrite` leaves evaluation whole on every rank by default (DDP108: "
                     "correct, not faster); `rewrite --shard-eval` shares out the loops it can prove")
    elif repeated:
        problems.append(f"inference only: every rank ran the model on all {total} samples the original did ({shares}): "
                        f"the migration repeats the whole inference on each of its {len(m)} processes; share out the "
                        "evaluation loop between the ranks (`dp2ddp rewrite` does where it can prove the results "
                        "the same, DDP168; its passes are read whole on every rank where the loader has fewer "
                        "batches than ranks or an order that is not fixed: give the run more data than one batch "
                        "per rank)")
    elif sum(m.values()) == total:
        notes.append(f"inference only: the ranks shared out the {total} samples the original ran its model on ({shares})")
    else:
        notes.append(f"inference only: the original ran its model on {total} samples, the ranks on {shares} (a loader "
                     "with fewer batches than ranks, or whose order is not fixed, is evaluated whole on each)")
