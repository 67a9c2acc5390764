"""What the runs leave behind: the files each run created or changed, compared as a user
would use them.

A migration can train identically and still change its outputs: a checkpoint that pickles
the DistributedDataParallel wrapper (it loads nowhere without a process group), keys that
gained DDP's ``module.`` prefix, one TensorBoard event file per rank, a log every rank
appends to, a file no rank writes any more. Each run works in a copy of the project of its
own, so what it wrote is the difference between a snapshot of that copy before and after
the run (relative paths, sizes, modification times; links to the user's files are not
outputs). Folders named in the script's arguments that lie outside it (``--out-dir
/abs/path``) are watched the same way, just before and after each run.

Every file is classified -- checkpoint, text, event file, image, JSON, CSV or other -- and
compared by what it holds:

* checkpoints are loaded by both sides in a fresh Python, without a process group or
  dp2ddp (``ckpt_load.py``), the way the project's own code would load them; a pickle that
  references ``DistributedDataParallel`` or fails to load where the original's loads is a
  problem naming the line that saved it. Keys, shapes and dtypes are compared, and the
  values where both runs saved at the same step and the noise envelope's run (the original
  again, each batch in chunks) saved too: it says how far float noise alone moves them;
* text files by their lines, JSON by its structure, CSV by header and rows, images by their
  dimensions; event files by their count; anything else is listed as not compared.

Names that differ only in numbers (times, process ids: TensorBoard's
``events.out.tfevents.<time>.<host>.<pid>``, ``rank0.log``) are grouped, so one event
file on each side is equal and two against one is a finding. Which rank wrote a file, and
the line that opened or saved it, come from the probe.

This module compares (:func:`compare`); its parts: :mod:`run_files` (the snapshots and
what a run wrote), :mod:`file_kinds`, :mod:`output_report`, :mod:`checkpoint_files` and
:mod:`checkpoint_diffs` (checkpoints read and compared), :mod:`file_diffs` (the other
kinds).
"""

from __future__ import annotations

import ast
from pathlib import Path

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from dp2ddp.verify.checkpoint_diffs import compare_arrays, compare_checkpoints
from dp2ddp.verify.checkpoint_files import load_checkpoints
from dp2ddp.verify.file_diffs import compare_csv, compare_image, compare_json, compare_text, line_count
from dp2ddp.verify.file_kinds import is_tensorboard, kind_of, pattern, pids_in_names
from dp2ddp.verify.output_report import ADVICE_NO_RANK, ADVICE_RANK0, MAX_LISTED, Report
from dp2ddp.verify.run_files import MAX_ENTRIES, RunOutputs


def compare(orig: RunOutputs, mig: RunOutputs, world: int, dp_in_original: bool, steps: int = 0,
            envelope: Optional[RunOutputs] = None, values: bool = True,
            loader: Optional[Callable[..., Dict[str, Dict[str, Dict[str, Any]]]]] = None,
            split: bool = True, stochastic: Sequence[str] = (), batches: Sequence[int] = (),
            readers: Sequence[Any] = ()) -> Dict[str, Any]:
    """The ``outputs`` section: files, differences (each with a severity, advice and the line
    that wrote the file where the probe saw it), notes.

    ``split``: the envelope run split its batches into world-size chunks (a DataParallel
    forward ran in it); ``stochastic``: the model's per-process kinds (``batchnorm``,
    ``dropout``); without the split the envelope measures neither, and checkpoint values
    that differ beyond it are reported as not judged (a warning), not as a problem.
    ``batches``: the original's samples per step, for images of a rank's share of a batch."""
    rep = Report()
    rep.unjudged = unjudged_reason(world, split, stochastic) if envelope is not None and values else None
    kinds = [k for k in ("batchnorm", "dropout", "random") if k in stochastic]
    rep.decided = (" and ".join({"batchnorm": "BatchNorm", "dropout": "dropout", "random": "random draws in the step"}[k] for k in kinds)
                   if kinds and values else None)
    rep.batches = sorted({int(b) for b in batches if b})
    rep.world = world
    o_files, m_files = orig.files, mig.files
    groups: Dict[str, Tuple[List[str], List[str]]] = {}
    for p in sorted(o_files):
        groups.setdefault(pattern(p), ([], []))[0].append(p)
    for p in sorted(m_files):
        groups.setdefault(pattern(p), ([], []))[1].append(p)

    # within a group: the same names first, then names that differ only in numbers
    pairs: List[Tuple[str, str, str]] = []  # (shown, original, migrated)
    for pat, (os_, ms) in sorted(groups.items()):
        same = [p for p in os_ if p in m_files]
        pairs.extend((p, p, p) for p in same)
        if len(os_) == len(ms):
            left_o, left_m = [p for p in os_ if p not in same], [p for p in ms if p not in same]
            pairs.extend((pat, a, b) for a, b in zip(left_o, left_m))
        else:
            _count(rep, pat, os_, ms, orig, mig, world)

    checkpoints = []
    for shown, a, b in pairs:
        entry = _one(rep, shown, a, b, orig, mig, world)
        if entry is not None:
            checkpoints.append(entry)
    if checkpoints:
        compare_checkpoints(rep, checkpoints, orig, mig, envelope if values else None, world, dp_in_original,
                     loader or load_checkpoints, readers)
        if envelope is not None and not values:
            rep.notes.append("checkpoint values not compared: the losses already differ")

    # written by several ranks
    for p, ranks in sorted(mig.writers.items()):
        if len(ranks) > 1 and p in m_files and not any(p in d["paths"] and d["kind"] == "writers" for d in rep.differences):
            _written_by_every_rank(rep, orig, mig, p, p, ranks)

    # deletions
    for p in sorted(orig.deleted ^ mig.deleted):
        who = "original" if p in orig.deleted else "migration"
        other = "migration" if who == "original" else "original"
        rep.add(p, "deleted", "warning", f"the {who} deletes {{path}}, the {other} does not",
                "check that the clean-up runs on the rank that should do it (once, on rank 0)")

    if orig.stopped and mig.stopped:
        rep.notes.append(
            f"both runs stopped after {steps} steps (--steps): what the scripts write after that point "
            "(a final checkpoint, results) was written by neither and is not compared; --steps 0 runs them to the end"
        )
    for run in (orig, mig):
        for label in run.incomplete:
            rep.notes.append(f"{label}: more than {MAX_ENTRIES} entries in the {run.role} run: not compared")
    shared = [r for r in orig.roots if r != "." and r in mig.roots]
    if shared:
        rep.notes.append(
            "folders named in the arguments, shared by both runs (each run's changes there are compared; "
            "each run also sees what the runs before it left there): " + ", ".join(shared)
        )
    outside = sorted(set(orig.outside) | set(mig.outside))
    if outside:
        more = f" and {len(outside) - MAX_LISTED} more" if len(outside) > MAX_LISTED else ""
        rep.notes.append("written outside the compared folders, not compared: " + ", ".join(outside[:MAX_LISTED]) + more)
    for why, paths in rep.not_compared.items():
        rep.notes.append(f"not compared ({why}): " + ", ".join(paths[:MAX_LISTED])
                         + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""))

    for note, paths in rep.shares.items():
        shown = ", ".join(paths[:MAX_LISTED]) + (f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else "")
        rep.notes.insert(0, note.replace("{path}", shown))
    differences = rep.finished()
    return {
        "equal": not differences,
        "files": rep.files,
        "differences": differences,
        "notes": rep.notes,
        "roots": sorted(set(orig.roots) | set(mig.roots)),
        "summary": summary_line(rep.files, differences),
    }


def unjudged_reason(world: int, split: bool, stochastic: Sequence[str]) -> Optional[str]:
    """Why the envelope cannot judge checkpoint values (None when it can): the model
    computes something per process that the envelope run does not reproduce.

    Without the split (the original ran no DataParallel forward on this machine, so the
    envelope run perturbed the gradients instead) it measures neither BatchNorm statistics
    nor dropout masks. With the split it still does not hold DDP's: DataParallel's chunks
    are contiguous slices of the whole batch, a rank's share is whatever its sampler or
    loaders hand it (a DistributedSampler strides over the dataset, a batch assembled from
    several loaders holds a part of each), so the statistics each BatchNorm normalises
    with differ; the chunks update the running statistics once each, one after the other,
    where DDP keeps rank 0's (its buffers are broadcast); and the chunks' dropout masks
    come from one random stream in turn, each rank's from its own. The losses, compared as
    a moving average, and the replicas' hashes still judge the training."""
    kinds = [k for k in ("batchnorm", "dropout", "random") if k in stochastic]
    if not kinds:
        return None
    what = {
        "batchnorm": f"BatchNorm normalises each rank's 1/{world} of the batch and keeps running statistics from it "
                     f"(as DataParallel does over {world} GPUs), the original's the whole batch",
        "dropout": "dropout draws each rank's masks from that process's own random stream",
        "random": "the training step draws random numbers (a permutation, noise), each rank from its own stream, "
                  "where the original drew the whole batch's at once",
    }
    if not split:
        return ("; ".join(what[k] for k in kinds)
                + f"; the envelope run could not measure that: the original ran no DataParallel forward on this machine "
                  f"(a script that wraps the model only on GPUs), so its batches could not be split into {world} chunks "
                  "as DataParallel splits them, and a gradient perturbation per step was measured instead")
    chunked = {
        "batchnorm": f"BatchNorm normalises each rank's share of the batch, as its sampler or loaders hand it out, "
                     f"and DDP keeps rank 0's running statistics (its buffers are broadcast); the envelope run's "
                     f"{world} chunks are contiguous slices of the whole batch, each updating the running statistics "
                     "in turn",
        "dropout": "dropout draws each rank's masks from that process's own random stream, the envelope run's chunks "
                   "theirs from one stream in turn",
        "random": what["random"],
    }
    return ("; ".join(chunked[k] for k in kinds)
            + f"; so the envelope run (the original with each batch split into {world} chunks, by DataParallel or at the model's outermost call) measures "
              "float noise, not these per-process differences")


def _ranks(ranks) -> str:
    r = sorted(ranks)
    return "rank " + str(r[0]) if len(r) == 1 else "ranks " + ", ".join(map(str, r[:-1])) + f" and {r[-1]}"


def _written_by_every_rank(rep: Report, orig: RunOutputs, mig: RunOutputs, a: str, b: str, ranks) -> bool:
    """The migration's ``b`` (the original's ``a``) was opened for writing by several ranks: a
    problem (True), or, where the others only opened it to append and it holds the original's
    lines, a note (False: it is compared as any other file)."""
    if _appended_once(orig, mig, a, b, ranks):
        note = (f"{b} is opened to append by every rank ({_ranks(ranks)}) and holds the original's {line_count(mig.where[b])} "
                "lines: the other ranks opened it and wrote nothing (a log handler made on every rank, disabled on all "
                "but rank 0)")
        if note not in rep.notes:
            rep.notes.append(note)
        return False
    rep.add(b, "writers", "problem", f"{{path}} is written by every rank ({_ranks(ranks)}){_lines(orig, mig, a, b)}",
            ADVICE_RANK0, mig.sites.get(b))
    return True


def _appended_once(orig: RunOutputs, mig: RunOutputs, a: str, b: str, ranks) -> bool:
    """A text file every rank but 0 only ever opened to append to, that holds as many lines as
    the original's: no rank but one wrote to it in this run (appended twice, its lines would
    be more)."""
    others = set(ranks) - {0}
    mb, oa = mig.where.get(b), orig.where.get(a)
    if not others or not others <= mig.appenders.get(b, set()) or mb is None or oa is None:
        return False
    if kind_of(mb) not in ("text", "csv"):
        return False
    lm, lo = line_count(mb), line_count(oa)
    return lm is not None and lm == lo and lm > 0


def _lines(orig: RunOutputs, mig: RunOutputs, a: Optional[str], b: str) -> str:
    """'; 4 lines against the original's 2' for text files, else the sizes."""
    mb = mig.where.get(b)
    oa = orig.where.get(a) if a else None
    if mb is not None and kind_of(mb) in ("text", "csv"):
        lm, lo = line_count(mb), line_count(oa)
        if lo is not None and lm is not None:
            return f": {lm} lines against the original's {lo}"
        return f": {lm} lines" if lm is not None else ""
    if a and a in orig.files and orig.files[a] and b in mig.files:
        return f"; {mig.files[b]} bytes against the original's {orig.files[a]}"
    return ""


def _same_function_sites(base: Optional[Path], site: str) -> set:
    """``site`` (``file.py:line``), and where its statement sits under an ``if`` of its
    function, every line of that function as a site: the writes one call of it makes, some
    of them decided by a test (``if is_best: shutil.copyfile(...)``)."""
    name, _, line = site.rpartition(":")
    found = {site}
    if base is None or not line.isdigit():
        return found
    try:
        tree = ast.parse((base / name).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return found
    n = int(line)
    funcs = [f for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.lineno <= n <= (f.end_lineno or 0)]
    if not funcs:
        return found
    func = max(funcs, key=lambda f: f.lineno)  # the innermost
    under_if = any(isinstance(s, ast.If) and s.lineno < n <= (s.end_lineno or 0) and s.lineno > func.lineno for s in ast.walk(func))
    return {f"{name}:{k}" for k in range(func.lineno, (func.end_lineno or func.lineno) + 1)} if under_if else found


def _count(rep: Report, pat: str, os_: List[str], ms: List[str], orig: RunOutputs, mig: RunOutputs, world: int) -> None:
    """A group of names (equal up to numbers) with a different number of files on each side."""
    tb = is_tensorboard(pat)
    folder = pat.rpartition("/")[0] or "."
    what = "TensorBoard event files" if tb else f"files named {pat}"
    sample = (mig.where.get(ms[0]) if ms else None) or (orig.where.get(os_[0]) if os_ else None)
    entry = {
        "path": pat,
        "kind": "events" if tb else (kind_of(sample) if sample else "other"),
        "original": {"files": len(os_), "bytes": sum(orig.files[p] for p in os_)},
        "migrated": {"files": len(ms), "bytes": sum(mig.files[p] for p in ms)},
        "status": "differs",
    }
    rep.files.append(entry)
    line = next((mig.sites[p] for p in ms if p in mig.sites), None)
    if not ms:
        entry["status"] = "missing"
        names = ", ".join(os_[:MAX_LISTED])
        written = next((orig.sites[p] for p in os_ if p in orig.sites), None)
        # the same line of the original wrote other files that the migration writes too: that
        # write runs on a rank, and this file was one call's decision (`if is_best:`)
        # (or a line of the same function, where this write sits under an `if` there: a
        # `save_checkpoint` that copies the best one with `if is_best:`)
        near = _same_function_sites(orig.base, written) if written else {written}
        reached = sorted(p for p, site in orig.sites.items()
                         if written and site in near and p not in os_ and p in mig.files)
        if rep.decided and reached:
            entry["status"] = "not judged"
            rep.add(pat, "missing", "warning",
                    f"the migration does not write {names if len(os_) == 1 else what + ' (' + names + ')'}; the original "
                    f"does, at {written}, where the migration writes {', '.join(reached[:MAX_LISTED])} too (the same line, "
                    f"or the same function with this write under an `if`): it runs on a rank, and this file was one call's decision (a best checkpoint, `if is_best:`), which "
                    f"a metric of a model with {rep.decided} decides; per-rank {rep.decided} moves such a metric "
                    "legitimately (the losses agree as a moving average), so its absence is not judged",
                    "check that the condition of this write (a best accuracy, say) is computed the same way on rank 0 "
                    "as in the original, from the whole evaluation set", None)
            return
        rep.add(pat, "missing", "problem",
                f"the migration does not write {names if len(os_) == 1 else what + ' (' + names + ')'}; the original does"
                + (f", at {written}" if written else ""), ADVICE_NO_RANK)
        return
    if not os_:
        entry["status"] = "extra"
        rep.add(pat, "extra", "warning",
                f"only the migration writes {what if len(ms) > 1 else ms[0]} ({len(ms)} file{'s' if len(ms) > 1 else ''})",
                "if these are per-rank files, write them on rank 0 only; if they are new on purpose (a rendezvous "
                "file, say), nothing to do", line)
        return
    if len(ms) > len(os_):
        carriers = pids_in_names(ms, mig.pids)
        why = []
        if len(ms) == len(os_) * world:
            why.append(f"one per process of {world}")
        if len(carriers) > 1:
            why.append(f"the names carry the pids of {_ranks(carriers)}")
        if tb:
            advice = ("only rank 0 should write: create the SummaryWriter under `if dist.get_rank() == 0:` "
                      "(and guard its add_scalar/close calls, or give the other ranks `None`)")
        else:
            advice = ("one per process: write it on rank 0 only (`if dist.get_rank() == 0:`); if per-rank files are "
                      "intended, name them by rank, not by process id")
        rep.add(pat, "count", "problem",
                f"the migration writes {len(ms)} {what} in {folder}/, the original {len(os_)}"
                + (f" ({'; '.join(why)})" if why else ""), advice, line)
        return
    rep.add(pat, "count", "problem",
            f"the migration writes {len(ms)} of the original's {len(os_)} {what} in {folder}/", ADVICE_NO_RANK, line)


def _one(rep: Report, shown: str, a: str, b: str, orig: RunOutputs, mig: RunOutputs, world: int) -> Optional[Dict[str, Any]]:
    """One file on each side (the same path, or names that differ only in numbers); a
    checkpoint is returned, to be loaded with the others."""
    sa, sb = orig.files[a], mig.files[b]
    kind = kind_of(mig.where[b])
    ko = kind_of(orig.where[a])
    if kind != ko and kind in ("text", "other") and ko not in ("text", "other"):
        kind = ko  # the original's says more (a checkpoint the migration garbled stays a checkpoint)
    entry: Dict[str, Any] = {
        "path": shown,
        "kind": kind,
        "original": {"files": 1, "bytes": sa},
        "migrated": {"files": 1, "bytes": sb},
        "status": "equal",
    }
    if a != b:
        entry["names"] = [a, b]
    rep.files.append(entry)
    ranks = mig.writers.get(b, set())
    if len(ranks) > 1 and _written_by_every_rank(rep, orig, mig, a, b, ranks):
        entry["status"] = "differs"
        return None
    if kind == "checkpoint":
        entry["_a"], entry["_b"], entry["_ranks"] = a, b, ranks
        return entry
    if kind == "array":
        compare_arrays(rep, entry, shown, a, b, orig, mig, world, ranks)
    elif kind == "text":
        compare_text(rep, entry, shown, a, b, orig, mig, world)
    elif kind == "json":
        compare_json(rep, entry, shown, a, b, orig, mig, world)
    elif kind == "csv":
        compare_csv(rep, entry, shown, a, b, orig, mig, world)
    elif kind == "image":
        compare_image(rep, entry, shown, a, b, orig, mig, ranks)
    elif kind == "events":
        entry["compared"] = "count"  # one on each side; their records are not read
    else:
        entry["status"] = "not compared"
        rep.not_compared.setdefault("a kind verify does not read", []).append(shown)
    return None


def summary_line(files: List[Dict[str, Any]], differences: List[Dict[str, Any]]) -> str:
    """One line for the report: 'equal (...)', 'nothing written', or the findings."""
    if not files and not differences:
        return "neither run wrote a file (nothing to compare)"

    def listed(names: List[str]) -> str:
        return ", ".join(names[:MAX_LISTED]) + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")

    def shown(f: Dict[str, Any]) -> str:
        if f["status"] == "share":
            return f["path"] + " (a rank's share of the batch: see notes)"
        if f["status"] == "not compared":
            return f["path"] + " (not compared)"
        changed = f.get("changed_lines")
        if changed:
            n, total = changed["numbers"] + changed["text"], f["original"].get("lines")
            what = "numbers" if not changed["text"] else "words"
            return f"{f['path']} ({f['compared']}; {what} differ on {n} of {total} line{'s' if total != 1 else ''})"
        return f["path"] + (f" ({f['compared']})" if f.get("compared") else "")

    if not differences:
        names = [shown(f) for f in files]
        return f"equal ({len(files)} file{'s' if len(files) != 1 else ''}: {listed(names)})"
    problems = sum(d["severity"] == "problem" for d in differences)
    warnings = len(differences) - problems
    parts = []
    if problems:
        parts.append(f"{problems} problem{'s' if problems > 1 else ''}")
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings > 1 else ''}")
    differing = []
    for d in differences:
        differing.extend(p for p in d["paths"] if p not in differing)
    equal = [shown(f) for f in files if f["status"] in ("equal", "share") and f["path"] not in differing]
    tail = f"; equal: {listed(equal)}" if equal else ""
    return f"{' and '.join(parts)} ({listed(differing)}){tail}"
