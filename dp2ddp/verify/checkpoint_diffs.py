"""Checkpoints compared (:func:`compare_checkpoints`): a pickled DistributedDataParallel
wrapper or a file that no longer loads is a problem naming the line that saved it; keys,
shapes and dtypes are compared, and values against the noise envelope's run (a value may
differ :data:`ENVELOPE_FACTOR` times the envelope's difference, or :data:`VALUE_FLOOR`)."""

from __future__ import annotations

import math
import re
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dp2ddp.verify.checkpoint_files import (DDP_REF, compare_structure, decode, key_path, numpy_structure, pickle_refs,
                                            safetensors_structure, strip_ansi)
from dp2ddp.verify.output_report import MAX_LISTED, Report
from dp2ddp.verify.run_files import RunOutputs


def compare_checkpoints(rep: Report, entries: List[Dict[str, Any]], orig: RunOutputs, mig: RunOutputs,
                 envelope: Optional[RunOutputs], world: int, dp_in_original: bool, loader, readers: Sequence[Any] = ()) -> None:
    """Load every checkpoint of both runs (and of the envelope's run, for the values) the way
    the project's own code would, then compare them."""
    flat_dir = (mig.work or Path(tempfile.gettempdir())) / "flat"
    values = envelope is not None
    jobs: Dict[str, Tuple[RunOutputs, List[Tuple[Path, Optional[Path], str]]]] = {"original": (orig, []), "migrated": (mig, [])}
    if values:
        jobs["envelope"] = (envelope, [])
        flat_dir.mkdir(parents=True, exist_ok=True)
    parity = {}
    for i, e in enumerate(entries):
        a, b = e["_a"], e["_b"]
        same_step = values and a in orig.steps and orig.steps.get(a) == mig.steps.get(b) and a in envelope.files
        parity[i] = same_step
        for role, run, name in (("original", orig, a), ("migrated", mig, b)):
            if run.where[name].suffix == ".safetensors":
                continue
            jobs[role][1].append((run.where[name], flat_dir / f"{role}-{i}.pt" if same_step else None, "default"))
        if same_step and envelope.where[a].suffix != ".safetensors":
            jobs["envelope"][1].append((envelope.where[a], flat_dir / f"envelope-{i}.pt", "default"))
    loaded = loader(jobs)
    for i, e in enumerate(entries):
        a, b = e.pop("_a"), e.pop("_b")
        ranks = e.pop("_ranks")
        pa, pb = orig.where[a], mig.where[b]
        shown = e["path"]
        line = mig.sites.get(b)
        e["format"] = "safetensors" if pb.suffix == ".safetensors" else "torch"
        if e["format"] == "safetensors":
            sta, why_a = safetensors_structure(pa)
            stb, why_b = safetensors_structure(pb)
            if sta is None or stb is None:
                e["status"] = "not compared"
                rep.not_compared.setdefault(why_a or why_b or "unreadable", []).append(shown)
                continue
            e["compared"] = "keys, shapes and dtypes"
            _structure_findings(rep, e, shown, compare_structure(sta, stb), dp_in_original, world, ranks, line, readers)
            continue
        ra = loaded.get("original", {}).get(str(pa), {"load": "failed", "errors": {"loader": "not loaded"}})
        rb = loaded.get("migrated", {}).get(str(pb), {"load": "failed", "errors": {"loader": "not loaded"}})
        refs_b = pickle_refs(pb)
        refs_a = pickle_refs(pa)
        e["original"]["load"], e["migrated"]["load"] = ra["load"], rb["load"]
        if DDP_REF in refs_b and DDP_REF not in refs_a:
            e["status"] = "differs"
            rep.add(shown, "wrapper", "problem",
                    "{path} pickles the DistributedDataParallel wrapper"
                    + (f" (saved at {line})" if line else "")
                    + ": it loads only where a process group exists, not in the project's own scripts"
                    + (f" ({_error(rb)})" if rb["load"] == "failed" else ""),
                    "save the model itself, as the original did: `model.module` (or `model.module.state_dict()`) "
                    "instead of the DDP-wrapped `model`", None)
            continue
        if ra["load"] != "failed" and rb["load"] == "failed":
            e["status"] = "differs"
            rep.add(shown, "load", "problem",
                    "{path} does not load in a fresh Python without a process group, where the original's does"
                    + (f" (saved at {line})" if line else "") + f": {_error(rb)}",
                    "save what the original saved (plain tensors or state_dicts, no distributed objects)", None)
            continue
        if ra["load"] == "default" and rb["load"] == "full":
            e["status"] = "differs"
            rep.add(shown, "load", "problem",
                    "{path} needs torch.load(weights_only=False), the original's loads with torch.load's defaults"
                    + (f" (saved at {line})" if line else "") + f": {_error(rb, 'default')}",
                    "save tensors and state_dicts as the original did, not whole objects", None)
            continue
        if ra["load"] == "failed":
            e["status"] = "not compared"
            rep.not_compared.setdefault(f"the original's does not load in a fresh Python either: {_error(ra)}", []).append(shown)
            continue
        if "structure" not in ra or "structure" not in rb:
            e["status"] = "not compared"
            rep.not_compared.setdefault("its structure could not be read", []).append(shown)
            continue
        e["compared"] = "keys, shapes and dtypes" + (" (loaded with weights_only=False, as the original's must be)"
                                                     if ra["load"] == "full" else "")
        diffs = compare_structure(decode(ra["structure"]), decode(rb["structure"]))
        _structure_findings(rep, e, shown, diffs, dp_in_original, world, ranks, line, readers)
        if parity.get(i) and e["status"] == "equal":
            env = loaded.get("envelope", {}).get(str(envelope.where[a]), {})
            _values(rep, e, shown, ra.get("flat"), rb.get("flat"), env.get("flat"), line, rep.unjudged)
    for line, found in rep.unjudged_files.items():
        shown, k, dm, de = max(found, key=lambda x: x[2] / max(x[3], 1e-300))
        in_file = f" of {shown}" if len(found) > 1 else ""
        for path, *_ in found:
            rep.add(path, "values", "warning",
                    f"{{path}}: values not judged: they differ by more than the noise envelope allows (worst: {k}{in_file}, "
                    f"relative difference {dm:.3g}, the envelope's {de:.3g}), and the envelope cannot tell whether that is "
                    f"legitimate: {rep.unjudged}",
                    "nothing to change for this alone: the losses are compared above; to have these values judged "
                    "against DataParallel's own split, run verify where the original wraps DataParallel (on GPUs)", line)


def compare_arrays(rep: Report, entry: Dict[str, Any], shown: str, a: str, b: str, orig: RunOutputs, mig: RunOutputs,
                   world: int, ranks) -> None:
    """NumPy's files (``np.save``, ``np.savez``) by their headers: names, shapes and dtypes,
    judged as a checkpoint's tensors are (an array that is a rank's share of a batch is a
    note; features or predictions of a whole set that shrank are a problem)."""
    sa, why_a = numpy_structure(orig.where[a])
    sb, why_b = numpy_structure(mig.where[b])
    if sa is None or sb is None:
        entry["status"] = "not compared"
        rep.not_compared.setdefault(why_a or why_b or "unreadable", []).append(shown)
        return
    entry["compared"] = "shapes and dtypes"
    _structure_findings(rep, entry, shown, compare_structure(sa, sb), True, world, ranks, mig.sites.get(b),
                        what_file="array file")


def _error(r: Dict[str, Any], mode: Optional[str] = None) -> str:
    errors = r.get("errors") or {}
    text = errors.get(mode) if mode else (errors.get("full") or errors.get("default") or errors.get("loader"))
    return strip_ansi(text or "it fails to load")


def _structure_findings(rep, entry, shown, diffs, dp_in_original, world, ranks, line, readers=(), what_file="checkpoint") -> None:
    share = _batch_share(diffs, world)
    if share is not None:
        entry["status"] = "share"
        who = f"rank {min(ranks)}'s" if len(ranks) == 1 else "one rank's"
        o, m = share
        rep.share(shown, f"{{path}}: the saved tensor is {who} share of a batch, not the whole batch "
                         f"(shape {m} in the migration, {o} in the original: 1/{world} of dimension 0); "
                         "under DDP each rank holds its part of the global batch; gather it "
                         "(`dist.all_gather`) before saving if the whole batch is wanted")
        return
    for d in diffs:
        entry["status"] = "differs"
        structure_difference(rep, shown, d, line, what_file, dp_in_original, readers)


def _values(rep, entry, shown, fa, fb, fe, line, unjudged: Optional[str] = None) -> None:
    """The tensors of both checkpoints (saved at the same step) against the envelope's: each
    may differ by ENVELOPE_FACTOR times what float noise alone made of it, or VALUE_FLOOR.
    With ``unjudged`` (why the envelope cannot measure what differs per process), a tensor
    beyond that is a warning saying so, not a problem."""
    if not (fa and fb and fe):
        return
    try:
        import torch

        ta = torch.load(fa, weights_only=True)
        tb = torch.load(fb, weights_only=True)
        te = torch.load(fe, weights_only=True)
    except Exception:  # noqa: BLE001
        return
    norm = re.compile(r"(^|/)module\.")
    tb = {norm.sub(r"\1", k): v for k, v in tb.items()}
    ta = {norm.sub(r"\1", k): v for k, v in ta.items()}
    te = {norm.sub(r"\1", k): v for k, v in te.items()}
    worst, where = 0.0, None
    typical = _typical_magnitude(ta, torch)
    for k, x in ta.items():
        y, z = tb.get(k), te.get(k)
        if y is None or z is None or x.shape != y.shape or x.shape != z.shape or not x.is_floating_point():
            continue
        dm, de = _reldiff(x, y, torch, typical), _reldiff(x, z, torch, typical)
        allowed = max(ACCUMULATOR_FLOOR if ACCUMULATOR.search(k) else VALUE_FLOOR, ENVELOPE_FACTOR * de)
        ratio = dm / allowed
        if ratio > worst:
            worst, where = ratio, (k, dm, de)
    entry["compared"] += ", values"
    entry["values"] = {"worst_ratio": worst, "tensor": where[0] if where else None,
                       "difference": where[1] if where else 0.0, "envelope": where[2] if where else 0.0}
    if worst > 1 and where and unjudged:
        entry["status"] = "not judged"
        entry["values"]["judged"] = False
        rep.unjudged_files.setdefault(line, []).append((shown,) + where)  # one finding per line that saved them
        return
    if worst > 1 and where:
        entry["status"] = "differs"
        k, dm, de = where
        rep.add(shown, "values", "problem",
                f"{{path}}: its values differ beyond float noise ({k}: relative difference {dm:.3g}, the noise "
                f"envelope's {de:.3g}, {ENVELOPE_FACTOR:g}x allowed)",
                "the migration saves a different state at the same step: save after the same step, from the "
                "synchronised model (`model.module`)", line)


def _typical_magnitude(state, torch) -> float:
    """The root mean square of every floating-point value the checkpoint holds."""
    total, count = 0.0, 0
    for v in state.values():
        if hasattr(v, "is_floating_point") and v.is_floating_point() and v.numel():
            total += float(v.double().pow(2).sum())
            count += v.numel()
    return math.sqrt(total / count) if count and math.isfinite(total) else 0.0


def _reldiff(x, y, torch, typical: float = 0.0) -> float:
    """The difference of two tensors relative to their size, or to the checkpoint's typical
    magnitude where they are far smaller: a tensor left at float noise (an attention key's
    bias, which no gradient reaches: values of 1e-11) differs by noise of its own size,
    which is no difference in what the model computes."""
    x, y = x.double(), y.double()
    num = float(torch.linalg.vector_norm(x - y))
    den = max(float(torch.linalg.vector_norm(x)), float(torch.linalg.vector_norm(y)), typical * math.sqrt(x.numel()), 1e-30)
    return num / den if math.isfinite(num) else math.inf


def _batch_share(diffs: List[Dict[str, Any]], world: int) -> Optional[Tuple[List[int], List[int]]]:
    """(original shape, migrated shape) when the only difference is that the saved object
    is a plain tensor (not a state_dict or a checkpoint entry) whose dimension 0 is the
    original's divided by the world size, every other dimension equal: a rank's share of a
    batch (DCGAN's ``torch.save(real_cpu, ...)``), which is how DDP splits the batch."""
    if world < 2 or len(diffs) != 1:
        return None
    d = diffs[0]
    if d["what"] != "shape" or d["path"] != ():
        return None
    o, m = list(d["original"]), list(d["migrated"])
    if len(o) != len(m) or not o or o[1:] != m[1:] or m[0] * world != o[0]:
        return None
    return o, m


def structure_difference(rep: Report, shown: str, d: Dict[str, Any], line: Optional[str], what_file: str = "checkpoint",
                          dp_in_original: bool = True, readers: Sequence[Any] = ()) -> None:
    from dp2ddp.verify.advice import module_prefix

    where = key_path(d["path"])
    keys_of = f"the keys under {where}" if where else "its keys"
    at = f"{where} " if where else "the saved object "
    what = d["what"]
    if what == "prefix":
        severity, message, advice = module_prefix(d, keys_of, dp_in_original, readers)
        rep.add(shown, "module_prefix", severity, message, advice, line)
        return
    if what == "keys":
        parts = []
        if d["only_original"]:
            parts.append("only in the original: " + ", ".join(map(str, d["only_original"][:MAX_LISTED])))
        if d["only_migrated"]:
            parts.append("only in the migration: " + ", ".join(map(str, d["only_migrated"][:MAX_LISTED])))
        rep.add(shown, "keys", "problem", f"{{path}}: {keys_of} differ ({'; '.join(parts)})",
                "the migration saves a different object (the wrapper instead of the model, a dropped optimizer "
                "or scheduler state): save what the original saved", line)
    elif what in ("shape", "length"):
        rep.add(shown, what, "problem",
                f"{{path}}: {at}has {what} {d['original']} in the original, {d['migrated']} in the migration",
                "a size that depends on the world size or on the per-process batch ends up in the "
                f"{what_file}: derive it from the global values", line)
    elif what == "dtype":
        rep.add(shown, "dtype", "problem",
                f"{{path}}: {at}is {d['original']} in the original, {d['migrated']} in the migration",
                "the migration changes the precision of what it saves (autocast, .half() or a default dtype set on "
                "some path): save in the original's dtype", line)
    else:
        rep.add(shown, "type", "problem",
                f"{{path}}: {at}is {d['original']} in the original, {d['migrated']} in the migration",
                "the migration saves a different kind of object there: save what the original saved", line)


ENVELOPE_FACTOR = 10.0  # a value may differ this many times the envelope's difference ...


VALUE_FLOOR = 1e-6  # ... or this much (relative), whichever is larger
# An optimizer's running sums of gradients (SGD's momentum buffer, Adam's moments: a state
# entry of a saved optimizer.state_dict(), ``optimizer/state/<index>/<name>``) carry the
# rounding of every gradient reduction, and a reduction whose terms cancel (a bias behind a
# ReLU and a pooling) rounds far more than its result's size, which is what the envelope
# perturbs by: 3.6e-6 against an envelope of 1.8e-7 on a correct migration. A wrong gradient
# (not averaged, scaled by the world size, a different batch) moves them by 1e-2 and more.
ACCUMULATOR = re.compile(r"(^|/)state/\d+/[^/]+$")
ACCUMULATOR_FLOOR = 1e-4
