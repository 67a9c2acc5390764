"""A run that hung or crashed, described for the report (:func:`describe_failure`: where
each rank stood, the first error, advice), and torch's exit race on gloo told from a real
failure (:func:`exit_race`)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

from dp2ddp.verify import stacks
from dp2ddp.verify.advice import advise
from dp2ddp.verify.options import Options
from dp2ddp.verify.runner import RunResult


def describe_failure(run: RunResult, opts: Options, problems: List[str], details: Dict[str, Any]) -> None:
    label = "original" if run.role == "original" else "migrated"
    distributed = run.role == "migrated"
    if run.hung:
        locs = []
        for rank, r in sorted(run.ranks.items()):
            loc = stacks.locate(rank, r.stack, opts.user_dirs, distributed=distributed)
            locs.append(loc.describe())
        done = run.steps
        problems.append(
            f"{label} run hung: no rank completed a step for {opts.timeout:g} s (after step {done}); "
            "all its processes were ended"
        )
        problems.extend("  " + line for line in locs)
        if distributed:
            problems.append(
                "  a rank waiting in a collective while another is elsewhere means the ranks diverged; "
                "rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL to see which collective"
            )
        # the migrated run's hang is compared first: it is the one the report shows
        details.setdefault("hang", {"role": label, "after_step": done, "ranks": locs,
                                    "detected_after_s": round(run.hang_after_s, 2)})
        return
    if run.exit_code in (0, None):
        return
    if exit_race(run):
        details.setdefault("exit_race", []).append(run.role)
        return
    from dp2ddp.verify.checkpoint_files import first_line, strip_ansi

    for r in run.ranks.values():  # torch colours some of its errors: no escape codes in a report
        if r.error:
            r.error = {k: strip_ansi(v) if isinstance(v, str) else v for k, v in r.error.items()}
        r.fatal = strip_ansi(r.fatal)
    errors = sorted((r.error for r in run.ranks.values() if r.error), key=lambda e: e["t"])
    first = next(((rank, r.error) for rank, r in sorted(run.ranks.items(), key=lambda kv: (kv[1].error or {}).get("t", math.inf)) if r.error), None)
    crash: Dict[str, Any] = {"role": label, "exit_code": run.exit_code}
    if first is not None:
        rank, err = first
        who = f"rank {rank}" if distributed else "the script"
        problems.append(f"{label} run crashed (exit code {run.exit_code}): {who} raised {err['type']}: {first_line(err['message'])}")
        crash.update(rank=rank, type=err["type"], message=err["message"], traceback=err["traceback"])
        text = err["traceback"]
        others = [e for e in errors if e is not err]
        if others:
            crash["other_ranks"] = [f"{e['type']}: {first_line(e['message'])}" for e in others]
    else:
        fatal = next(((rank, r.fatal) for rank, r in sorted(run.ranks.items()) if r.fatal.strip()), None)
        log = strip_ansi(run.log_tail(200))  # read once: the last 30 lines are the tail kept in the report
        tail = "\n".join(log.splitlines()[-30:])
        if fatal:
            crash.update(rank=fatal[0], traceback=fatal[1])
            problems.append(f"{label} run crashed (exit code {run.exit_code}): rank {fatal[0]} died of a fatal signal")
        else:
            problems.append(f"{label} run failed (exit code {run.exit_code}); its output ends with:")
            problems.extend("  " + line for line in _script_tail(log)[-8:])
        crash["log_tail"] = tail
        text = tail + (fatal[1] if fatal else "")
    outside = outside_the_copy(text, run.root)
    # a file above the project's copy is missing from every run, not written late by rank 0
    tips = ([OUTSIDE_ADVICE.format(path=outside)] if outside else []) + advise(text, distributed=distributed and not outside)
    crash["advice"] = tips
    problems.extend("  advice: " + t for t in tips)
    details.setdefault("crashes", []).append(crash)


_MISSING = re.compile(r"No such file or directory: '([^']+)'")

OUTSIDE_ADVICE = (
    "The script reads `{path}`, outside the project folder verify copies for each run: nothing is there in "
    "a run's scratch folder. Pass --project-root a folder above that holds both the script and that file "
    "(verify mirrors it, read-only), or give the script the file's absolute path."
)


def outside_the_copy(text: str, root) -> Optional[str]:
    """The path a ``FileNotFoundError`` in ``text`` names where it lies outside the run's copy
    of the project: relative and climbing out of it (``../data/Synapse/...``, the working
    directory being inside the copy), or absolute under the run's scratch folder but not
    under the copy; ``None`` otherwise."""
    found = _MISSING.search(text)
    if found is None:
        return None
    path = found.group(1)
    if not os.path.isabs(path):
        return path if path.replace("\\", "/").startswith("../") else None
    if root is None:
        return None
    p = Path(path)
    if p == Path(root) or Path(root) in p.parents:
        return None
    return path if Path(root).parent in p.parents else None


def _script_tail(log: str) -> List[str]:
    """The lines the script printed last: under torchrun, those before the launcher's own
    report of the failure (``... failed (exitcode: 1) local_rank: 0 ...``, its traceback and
    the ``ChildFailedError`` box), where a script's ``SystemExit("...")`` message is."""
    lines = log.splitlines()
    cut = next((i for i, line in enumerate(lines) if "failed (exitcode:" in line and "local_rank" in line), None)
    kept = [line for line in (lines[:cut] if cut else lines) if line.strip()]
    return kept or lines


# libstdc++'s message when std::terminate runs with no exception in flight
EXIT_RACE_SIGN = "terminate called without an active exception"


EXIT_RACE_NOTE = (
    "{role} run: a rank aborted while its interpreter shut down, after every rank had finished and "
    "reported its parameters — a torch 2.13 race on gloo (a worker thread frees the last all-reduce "
    "while Python finalizes), not a fault of the script; the comparison below is complete"
)


def exit_race(run: RunResult) -> bool:
    """The run's only failure is torch's exit race on gloo: every rank finished (the
    probe's end record, with the parameter hash, is written before the interpreter shuts
    down) and raised nothing, and then a process died with libstdc++'s terminate message."""
    if run.hung or run.interrupted or run.exit_code in (0, None) or not run.ranks:
        return False
    if any(r.end is None or r.error for r in run.ranks.values()):
        return False
    return EXIT_RACE_SIGN in run.log_tail(400) + "".join(r.fatal for r in run.ranks.values())
