"""Compare an original run with its migration (losses, replicas, failures), then combine
the pairs of runs, the speed measurement and the outputs into one report. The losses are
judged in :mod:`losses`, failures described in :mod:`failures`; :class:`Options` is
:mod:`options`'."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from dp2ddp.verify import partition, printed
from dp2ddp.verify.failures import EXIT_RACE_NOTE, describe_failure
from dp2ddp.verify.losses import judge_losses, relative, step_draws, step_loss
from dp2ddp.verify.options import Options
from dp2ddp.verify.runner import RunResult


def _per_step(run: RunResult) -> List[Tuple[Optional[float], int, float]]:
    """(global loss, global samples, completion time) per step, over all ranks."""
    ranks = [r for _, r in sorted(run.ranks.items()) if r.steps]
    if not ranks:
        return []
    n = min(len(r.steps) for r in ranks)
    out = []
    for i in range(n):
        recs = [r.steps[i] for r in ranks]
        samples = [int(x.get("samples") or 0) for x in recs]
        t = max(float(x["t"]) for x in recs)
        out.append((step_loss([x.get("loss") for x in recs], samples), sum(samples), t))
    return out


def throughput(per_step, warmup: int) -> Tuple[Optional[float], List[Optional[float]]]:
    """Steady-state samples/s (steps after ``warmup`` only) and samples/s of each step."""
    rates: List[Optional[float]] = [None]
    for (_, s, t), (_, _, t0) in zip(per_step[1:], per_step):
        rates.append(s / (t - t0) if t > t0 and s else None)
    n = len(per_step)
    if n < 2:
        return None, rates
    first = min(warmup, n - 2)  # keep at least one interval
    samples = sum(s for _, s, _ in per_step[first + 1 :])
    dt = per_step[-1][2] - per_step[first][2]
    if dt <= 0 or not samples:
        return None, rates
    return samples / dt, rates


def gpu_memory(run: RunResult) -> Optional[Dict[str, Any]]:
    """Peak GPU memory of each rank of ``run`` (MiB, the most of any device it used, from the
    probe's end record), and the device's name; None when no rank used CUDA."""
    peaks: Dict[str, float] = {}
    name = None
    for rank, r in sorted(run.ranks.items()):
        devices = (r.end or {}).get("gpu") or []
        if devices:
            top = max(devices, key=lambda d: d.get("peak_allocated", 0))
            peaks[str(rank)] = round(top.get("peak_allocated", 0) / 2**20, 1)
            name = name or top.get("name")
    if not peaks:
        return None
    return {"device": name, "peak_allocated_mib": peaks, "max_mib": max(peaks.values())}


def _migration_trains(opts: Options) -> bool:
    """The migrated script has a training step (its own or in the project code it runs): a run
    without one is its evaluation-only mode (``-e``, ``--eval``), whose loaders ``rewrite`` leaves
    whole on every rank by default (DDP108)."""
    if not opts.migrated:
        return False
    try:
        from dp2ddp.model.core import build
        from dp2ddp.model.training import training_site

        with open(opts.migrated, "rb") as fh:
            return training_site(build(fh.read(), opts.migrated)) is not None
    except Exception:  # unreadable or unparsable: judged as an inference script
        return False


def compare(orig: RunResult, mig: RunResult, opts: Options, envelope: Optional[RunResult] = None) -> Dict[str, Any]:
    """One pair of runs: failures, losses, global batch, set_epoch, replicas, and this
    pair's speed-up (a figure only: the speed verdict is :func:`combine`'s, over pairs)."""
    problems: List[str] = []
    notes: List[str] = []
    details: Dict[str, Any] = {}
    for run in (mig, orig):
        describe_failure(run, opts, problems, details)

    raced = details.get("exit_race", [])  # found by describe_failure: its logs are read once
    notes.extend(EXIT_RACE_NOTE.format(role=role) for role in raced)

    def failed(run: RunResult) -> bool:
        return run.hung or (run.exit_code != 0 and run.role not in raced)

    po, pm = _per_step(orig), _per_step(mig)
    inference = None
    if not po and not pm and not failed(orig) and not failed(mig) and orig.ranks and mig.ranks:
        # no step in either run: compare what they print
        inference = printed.judge(orig, mig, envelope, evaluation_whole=_migration_trains(opts))
        problems.extend(inference["problems"])
        notes.extend(inference["notes"])
    for run, per in ((orig, po), (mig, pm)):
        if inference is None and not per and run.exit_code == 0 and not run.hung:
            problems.append(
                f"no optimizer step was observed in the {run.role} run: the script is inference-only, or "
                "its training loop does not call a torch.optim optimizer's step(); nothing to compare"
            )

    # what the model contains (seen in the first step's forward)
    kinds = set()
    for run in (orig, mig):
        for r in run.ranks.values():
            if r.steps:
                kinds.update(r.steps[0].get("modules") or [])
    stochastic = sorted(kinds & {"batchnorm", "dropout"})
    draws = step_draws(orig, mig)
    if draws == "aligned":
        notes.append("the training step draws random numbers, and every rank's generator was where the original's "
                     "was at each of the first steps (each rank drew what the original drew, as dp2ddp's migration "
                     "of per-sample noise does): the draws are the original's, judged as exactly as the rest")
    elif draws == "apart":
        stochastic.append("random")  # the training step draws random numbers: see _judge's moving average
    if mig.ranks and any(r.steps for r in mig.ranks.values()) and "ddp" not in kinds:
        problems.append("no DistributedDataParallel module was seen in the migrated run's forward pass")

    n = min(len(po), len(pm))
    judged = judge_losses(orig, mig, envelope, opts, stochastic, n, problems, notes)
    lo = [x[0] for x in po[:n]]
    lm = [x[0] for x in pm[:n]]
    pairs = [(a, b) for a, b in zip(lo, lm) if a is not None and b is not None]
    diffs = [relative(a, b) for a, b in pairs]
    max_rel = max(diffs) if diffs else None
    steps_compared = len(pairs)
    losses_agree = bool(steps_compared) and judged["agree"]
    tol_desc = judged["rule"]

    # the data each rank served
    data = partition.analyze(orig, mig, opts.nproc * opts.nnodes) if mig.ranks else None
    if data is not None:
        problems.extend(data["problems"])
        notes.extend(data["notes"])

    # global batch per step must match for the orders to line up
    so = [x[1] for x in po[:n]]
    sm = [x[1] for x in pm[:n]]
    bad = next((i for i, (a, b) in enumerate(zip(so, sm)) if a != b and a and b), None)
    if bad is not None:
        if data and data["unsharded"]:
            why = "the loader is not sharded (above): shard it first; the per-process batch is then the original's divided by the world size"
        else:
            why = "the per-process batch_size should be the original's divided by the world size"
        problems.append(
            f"step {bad + 1} used {so[bad]} samples in the original but {sm[bad]} over all migrated ranks: "
            f"the global batch differs ({why})"
        )

    # DistributedSampler iterated again without set_epoch: one finding with the data evidence's
    replay = next((i for i, p in enumerate(problems) if "replays epoch 0" in p), None)
    for rank, r in sorted(mig.ranks.items()):
        seen: Dict[int, List[int]] = {}
        for ev in r.samplers:
            if ev.get("kind") == "distributed" and ev.get("shuffle"):
                seen.setdefault(ev["id"], []).append(ev["epoch"])
        stuck = [eps for eps in seen.values() if len(eps) > 1 and len(set(eps)) < len(eps)]
        if stuck:
            head = f"a DistributedSampler was iterated {len(stuck[0])} times with epochs {stuck[0]}"
            if replay is not None:
                problems[replay] = f"{head}: {problems[replay]}"
            else:
                problems.append(
                    f"{head}: call loader.sampler.set_epoch(epoch) at the start of every epoch, or each epoch "
                    "repeats the same order"
                )
            break

    # replicas
    ends = {rank: r.end for rank, r in sorted(mig.ranks.items())}
    hashes = {rank: e.get("hash") for rank, e in ends.items() if e}
    replicas_compared = bool(hashes) and len(ends) == len(hashes) and None not in hashes.values()
    replicas_in_sync = replicas_compared and len(set(hashes.values())) == 1
    mig_failed = failed(mig)
    if hashes and None not in hashes.values() and len(set(hashes.values())) > 1 and not mig_failed:
        norms = ", ".join(f"rank {k}: {ends[k].get('norm', 0):.9g}" for k in hashes)
        problems.append(
            "replicas out of sync: the ranks end with different parameters (norms " + norms + "); "
            "is the model wrapped in DistributedDataParallel, and do all ranks start from the same weights?"
        )
    elif pm and not replicas_in_sync and not mig_failed:
        problems.append("replica parameters could not be compared (no rank reported its parameters)")

    # speed: this pair's ratio; judged over all measured pairs by combine()
    sps_o, rates_o = throughput(po, opts.warmup)
    sps_m, rates_m = throughput(pm, opts.warmup)
    speedup = sps_m / sps_o if sps_o and sps_m else None
    if min(len(po), len(pm)) <= opts.warmup + 1 and po and pm:
        notes.append(f"only {min(len(po), len(pm))} steps: throughput includes warm-up steps (raise --steps)")

    failed_run = any(failed(r) for r in (orig, mig))
    passed = (
        not failed_run
        and steps_compared > 0
        and losses_agree
        and replicas_in_sync
        and bad is None
        and not any(p.startswith("no DistributedDataParallel") for p in problems)
        and not (data and data["problems"])
    ) or (not failed_run and inference is not None and inference["agree"] and not (data and data["problems"]))

    def side(run: RunResult, per, sps):
        out = {
            "steps": len(per),
            "samples_per_s": sps,
            "wall_s": round(run.wall_s, 3),
            "exit_code": run.exit_code,
            "hung": run.hung,
            "ranks": len(run.ranks),
        }
        gpu = gpu_memory(run)
        if gpu:
            out["gpu_memory"] = gpu
        return out

    report: Dict[str, Any] = {
        "verdict": "pass" if passed else "fail",
        "losses_agree": losses_agree,
        "max_rel_loss_diff": max_rel,
        "steps_compared": steps_compared,
        "replicas_in_sync": replicas_in_sync,
        "replicas_compared": replicas_compared,
        "speedup": speedup,
        "min_speedup": opts.min_speedup,
        "tolerance": judged["tolerance"],
        "optimizers": judged["optimizers"],
        "data": {k: v for k, v in data.items() if k in ("loaders", "unsharded")} if data else None,
        "original": side(orig, po, sps_o),
        "migrated": dict(side(mig, pm, sps_m), nproc=opts.nproc, nnodes=opts.nnodes),
        "problems": problems,
        "notes": notes,
        "losses": {"original": [x[0] for x in po], "migrated": [x[0] for x in pm]},
        "throughput": {"original": rates_o, "migrated": rates_m},
        "replica_hashes": {str(k): v for k, v in hashes.items()},
    }
    if inference is not None:
        report["inference"] = {"agree": inference["agree"], "lines": inference["lines"], "noise": inference["noise"]}
    report.update(details)
    return report


def combine(pairs, outputs: Optional[Dict[str, Any]], threads: Dict[str, Any], opts: Options, notes: List[str]) -> Dict[str, Any]:
    """One report from every pair of runs (``session.Pair``): the comparison of the first
    pair that failed, else of the first pair (every pair was compared, in full); the speed
    over the measured pairs; the outputs of the first pair."""
    from dp2ddp.verify import speed as speed_mod

    failing = next((p for p in pairs if p.report["verdict"] == "fail"), None)
    base = failing or pairs[0]
    rep: Dict[str, Any] = dict(base.report)
    rep["original"], rep["migrated"] = dict(rep["original"]), dict(rep["migrated"])
    problems: List[str] = list(rep["problems"])
    rep_notes: List[str] = list(rep["notes"])
    if base.index > 1:
        problems.insert(
            0,
            f"pair {base.index} of runs failed after {base.index - 1} that passed: the migration does not behave "
            f"the same in every run (below: pair {base.index})",
        )
    for p in pairs:
        if p is not base:
            rep_notes.extend(f"pair {p.index}: {n}" for n in p.report["notes"] if n not in rep_notes)
    rep_notes.extend(notes)

    measured = [p for p in pairs if not p.warmup]
    speed = speed_mod.summarize([p.report["speedup"] for p in measured], opts.min_speedup)
    rep["speedup"] = speed["median"]
    rep["speed"] = speed
    for role in ("original", "migrated"):
        sps = [p.report[role]["samples_per_s"] for p in measured if p.report[role]["samples_per_s"]]
        walls = [p.report[role]["wall_s"] for p in measured]
        if len(measured) > 1:
            rep[role]["samples_per_s"] = statistics.median(sps) if sps else None
            rep[role]["wall_s"] = round(statistics.median(walls), 3) if walls else None
    if not speed["meets_min_speedup"]:
        o, m = rep["original"]["samples_per_s"], rep["migrated"]["samples_per_s"]
        if speed["ci"] is None:
            problems.append(
                f"the migrated run is {'slower' if speed['median'] < 1 else 'not fast enough'}: {m:.1f} vs {o:.1f} "
                f"samples/s (speed-up {speed['median']:.2f} < --min-speedup {opts.min_speedup:g}; one pair)"
            )
        else:
            lo, hi = speed["ci"]
            problems.append(
                f"the migrated run is measurably {'slower' if hi < 1 else 'not fast enough'}: speed-up "
                f"{speed_mod.x(speed['median'])}, {speed['confidence']:.0%} interval {speed_mod.x(lo)} to "
                f"{speed_mod.x(hi)} over {speed['pairs']} pairs, all below --min-speedup {opts.min_speedup:g}"
            )
    elif opts.min_speedup > 0 and speed["ci"] is not None and speed["median"] < opts.min_speedup:
        rep_notes.append(f"speed-up against --min-speedup {opts.min_speedup:g}: {speed['judgement']}")
    elif opts.min_speedup > 0 and speed["ci"] is None and speed["median"] is not None:
        rep_notes.append(f"speed-up against --min-speedup {opts.min_speedup:g}: {speed['judgement']}")
    rep["pairs"] = [
        {
            "pair": p.index,
            "order": list(p.order),
            "warmup": p.warmup,
            "speedup": p.report["speedup"],
            "verdict": p.report["verdict"],
            "wall_s": round(p.wall_s, 3),
        }
        for p in pairs
    ]
    rep["runs"] = [
        dict(
            {"pair": p.index, "role": role, "warmup": p.warmup},
            **{k: p.report[role][k] for k in ("steps", "samples_per_s", "wall_s", "exit_code", "hung")},
            throughput=p.report["throughput"][role],
        )
        for p in pairs
        for role in p.order
    ]
    rep["pair"] = base.index
    rep["threads"] = threads

    warnings: List[str] = []
    outputs_ok = True
    if outputs is not None:
        rep["outputs"] = outputs
        for d in outputs["differences"]:
            line = f"outputs: {d['message']}"
            if d["severity"] == "problem":
                outputs_ok = False
                problems.extend([line, f"  advice: {d['advice']}"])
            else:
                warnings.extend([line, f"  advice: {d['advice']}"])
        rep_notes.extend(f"outputs: {n}" for n in outputs["notes"])
    rep["problems"], rep["notes"], rep["warnings"] = problems, rep_notes, warnings
    passed = failing is None and speed["meets_min_speedup"] and outputs_ok
    rep["verdict"] = "pass" if passed else "fail"
    return rep
