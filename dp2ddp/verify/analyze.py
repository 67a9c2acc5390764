"""Compare an original run with its migration (losses, replicas, failures), then combine
the pairs of runs, the speed measurement and the outputs into one report."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from dp2ddp.verify import partition, stacks
from dp2ddp.verify.advice import advise
from dp2ddp.verify.runner import RunResult

WINDOW = 5  # steps in the moving average of the tolerance path
ENVELOPE_FACTOR = 10.0  # a step's loss may differ this many times the noise envelope at that step ...


@dataclass
class Options:
    steps: int
    warmup: int
    rtol: float
    stochastic_rtol: float
    min_speedup: float
    timeout: float
    user_dirs: List[str]
    nproc: int
    nnodes: int


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
        losses = [x.get("loss") for x in recs]
        t = max(float(x["t"]) for x in recs)
        if any(v is None for v in losses):
            loss = None
        elif all(samples):
            loss = sum(v * s for v, s in zip(losses, samples)) / sum(samples)
        else:
            loss = sum(losses) / len(losses)
        out.append((loss, sum(samples), t))
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


def _moving(xs: List[float], w: int) -> List[float]:
    out = []
    for i in range(len(xs)):
        seg = xs[max(0, i - w + 1) : i + 1]
        out.append(sum(seg) / len(seg))
    return out


def _rel(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def series(run: RunResult) -> Dict[int, List[Tuple[Optional[float], Optional[float]]]]:
    """Per optimizer (by creation order, the same in both runs): (global loss, learning rate)
    of each of its steps, over all ranks (losses weighted by the ranks' samples where the
    step counted them, else their plain mean)."""
    ranks = [r for _, r in sorted(run.ranks.items()) if r.steps or r.osteps]
    per_rank = []
    for r in ranks:
        by: Dict[int, List[dict]] = {}
        for rec in sorted(r.steps + r.osteps, key=lambda x: float(x.get("t") or 0)):
            by.setdefault(int(rec.get("o") or 0), []).append(rec)
        per_rank.append(by)
    out: Dict[int, List[Tuple[Optional[float], Optional[float]]]] = {}
    for o in sorted({o for by in per_rank for o in by}):
        lists = [by.get(o, []) for by in per_rank]
        n = min(len(x) for x in lists)
        seq = []
        for i in range(n):
            recs = [x[i] for x in lists]
            losses = [x.get("loss") for x in recs]
            samples = [int(x.get("samples") or 0) for x in recs]
            if any(v is None for v in losses):
                loss = None
            elif all(samples):
                loss = sum(v * w for v, w in zip(losses, samples)) / sum(samples)
            else:
                loss = sum(losses) / len(losses)
            seq.append((loss, recs[0].get("lr")))
        out[o] = seq
    return out


def optimizers(run: RunResult) -> Dict[int, Dict[str, Any]]:
    """What the lowest rank reported of each optimizer that stepped: kind, site, steps."""
    for _, r in sorted(run.ranks.items()):
        if r.end and r.end.get("optimizers"):
            return {int(o["index"]): o for o in r.end["optimizers"]}
    return {}


def judge_losses(orig: RunResult, mig: RunResult, envelope: Optional[RunResult], opts: Options,
                 stochastic: List[str], n_primary: int, problems: List[str], notes: List[str]) -> Dict[str, Any]:
    """Every optimizer's losses and learning rates, step by step, against the float-noise
    envelope: the original run again with each batch split into world-size chunks whose
    gradients are summed (DDP's reduction order, and its per-rank BatchNorm statistics,
    without DDP). The migration may differ at step k by ENVELOPE_FACTOR times the largest
    relative difference the envelope run reached up to step k, or by --rtol (the
    precision floor), whichever is larger. BatchNorm and dropout are compared as a moving
    average. Without an envelope (it failed, or one process): --rtol, or --stochastic-rtol
    for BatchNorm and dropout."""
    so, sm = series(orig), series(mig)
    se = series(envelope) if envelope is not None and not envelope.hung and envelope.exit_code == 0 else {}
    method = None
    if se:
        ends = [r.end for r in envelope.ranks.values() if r.end]
        method = "chunks" if any(e.get("envelope") == "chunks" for e in ends) else "perturb"
        bn_chunks = method == "perturb" and any(e.get("bn_chunks") for e in ends)
        if "random" in stochastic:
            se = {}  # each rank draws its own random numbers: no run of the original reproduces them
            notes.append("the noise envelope does not cover random draws in the training step (each rank draws "
                         "from its own stream, the original drew the whole batch's): --stochastic-rtol decides")
        elif method == "perturb" and stochastic == ["batchnorm"] and bn_chunks:
            method = "perturb+bn"  # the envelope run normalised each chunk on its own: per-rank statistics covered
        elif method == "perturb" and stochastic:
            se = {}  # a gradient perturbation per step says nothing of per-rank BatchNorm statistics or dropout masks
            notes.append("the noise envelope does not cover dropout (or BatchNorm it could not chunk) without "
                         "DataParallel's chunks (the original ran without DataParallel here): --stochastic-rtol decides")
    elif envelope is not None:
        notes.append("the noise envelope was not measured (its run of the original did not finish): fixed tolerances")
    o_info, m_info = optimizers(orig), optimizers(mig)
    primary = next((int(r.steps[0].get("o") or 0) for _, r in sorted(orig.ranks.items()) if r.steps), 0)
    worst = {"ratio": 0.0, "step": None, "optimizer": None}
    agree = True
    report_opts = []
    any_steps = False
    for o in sorted(set(so) | set(sm)):
        lo, lm, le = so.get(o, []), sm.get(o, []), se.get(o, [])
        info = o_info.get(o) or m_info.get(o) or {}
        name = _opt_name(o, info, m_info.get(o), mig)
        if o == primary:
            lo, lm = lo[:n_primary], lm[:n_primary]
        entry: Dict[str, Any] = {"index": o, "kind": info.get("kind"), "name": name,
                                 "steps": {"original": len(so.get(o, [])), "migrated": len(sm.get(o, []))}}
        report_opts.append(entry)
        if not lo or not lm:
            if lo or lm:
                agree = False
                problems.append(f"{name} steps in the {'original' if lo else 'migrated'} run only "
                                f"({len(lo) or len(lm)} steps): the migration does not train it as the original does")
            continue
        if abs(len(lo) - len(lm)) > 1 and o != primary:
            problems.append(f"{name} stepped {len(so[o])} times in the original, {len(sm[o])} in the migration")
            agree = False
        k = min(len(lo), len(lm))
        any_steps = True
        ok, first, ratio, at = _judge(lo[:k], lm[:k], le[:k], opts, stochastic, bool(se))
        entry.update(worst_ratio=ratio, worst_step=at)
        if ratio > worst["ratio"] or worst["step"] is None:
            worst = {"ratio": ratio, "step": at, "optimizer": o}
        if not ok:
            agree = False
            a, b, allowed = first[1], first[2], first[3]
            problems.append(
                f"losses disagree from step {first[0]}" + (f" of {name}" if len(so) > 1 or o != primary else "")
                + f": original {a:.7g}, migrated {b:.7g} (relative difference {_rel(a, b):.3g} > {allowed:.3g} allowed: "
                + ("the noise envelope's" if se else "the tolerance") + ")"
            )
        lr_bad = next((i for i in range(k) if lo[i][1] is not None and lm[i][1] is not None and
                       _rel(lo[i][1], lm[i][1]) > 1e-6), None)
        if lr_bad is not None:
            agree = False
            problems.append(f"the learning rate of {name} differs from step {lr_bad + 1}: original {lo[lr_bad][1]:.6g}, "
                            f"migrated {lm[lr_bad][1]:.6g} (a scheduler stepped per batch on each rank, or a rate scaled "
                            "by the world size)")
    if se:
        how = {"chunks": f"the original run again with each batch split into {opts.nproc * opts.nnodes} chunks by "
                         "DataParallel, their gradients summed (DDP's reduction order without DDP)",
               "perturb": f"the original run again with every gradient element perturbed at each step by "
                          f"{opts.nproc * opts.nnodes} roundings (eps of its dtype) of its magnitude plus the tensor's RMS, "
                          "the reduction-order noise of an all-reduce (it ran without DataParallel, so no chunks)",
               "perturb+bn": f"the original run again with every BatchNorm normalising each batch in {opts.nproc * opts.nnodes} "
                             "chunks on its own (per-rank statistics) and every gradient element perturbed at each step by "
                             f"{opts.nproc * opts.nnodes} roundings of its magnitude plus the tensor's RMS (it ran without "
                             "DataParallel, so no chunks of the model's input)"}[method]
        rule = (f"within {ENVELOPE_FACTOR:g}x the float-noise envelope ({how}), at least --rtol {opts.rtol:g}"
                + (f"; {', '.join(stochastic)}: as a {WINDOW}-step moving average" if stochastic else ""))
        kind = "envelope"
        if any_steps:
            notes.append(f"losses judged against the measured noise envelope: {how}; the migration stayed within "
                         f"{worst['ratio']:.2g} of what it allows (worst at step {worst['step']})"
                         if worst["ratio"] <= 1 else
                         f"losses judged against the measured noise envelope: {how}")
    elif stochastic:
        rule = f"{WINDOW}-step moving average within {opts.stochastic_rtol:g} relative"
        kind = "stochastic"
    else:
        rule = f"every step within {opts.rtol:g} relative"
        kind = "exact"
    if stochastic:
        why = {
            "batchnorm": "BatchNorm normalises each rank's batch on its own (DataParallel-on-one-device and "
            "SyncBatchNorm use the whole batch): a legitimate difference"
            + (", judged against the chunked run, which normalises each chunk alike" if method == "chunks" else ""),
            "dropout": "dropout masks come from each process's own random stream: a legitimate difference",
            "random": "the training step draws random numbers (mixup's permutation, a GAN's noise), each rank its "
            "share from its own stream where the original drew the whole batch's: the losses can agree only "
            "statistically",
        }
        notes.append("losses compared as a moving average: " + "; ".join(why[k] for k in stochastic))
    tolerance = {"kind": kind, "rule": rule, "why": stochastic, "rtol": opts.rtol if kind != "stochastic" else opts.stochastic_rtol,
                 "method": method, "factor": ENVELOPE_FACTOR if se else None, "worst_ratio": worst["ratio"] if se else None,
                 "worst_step": worst["step"]}
    return {"agree": agree, "rule": rule, "tolerance": tolerance, "optimizers": report_opts}


def _opt_name(o: int, info: Dict[str, Any], mig_info: Optional[Dict[str, Any]], mig: RunResult) -> str:
    kind = info.get("kind") or "optimizer"
    site = (mig_info or {}).get("site")
    where = ""
    if site:
        root = getattr(mig, "root", None)
        where = f", {partition.show_site(site, root)}"
    return f"optimizer {o} ({kind}{where})"


def _aligned_draws(orig, mig) -> bool:
    """Every migrated rank's default generator was in the original's state at each of the
    first steps (the probe's ``rng`` marks): whatever the steps drew, each rank drew the
    same numbers as the original, so random draws do not make the losses stochastic."""
    want = next((r.end.get("rng") for r in orig.ranks.values() if r.end and r.end.get("rng")), None)
    if not want or len(want) < 2 or not mig.ranks:
        return False
    return all(r.end and r.end.get("rng") == want for r in mig.ranks.values())


def _judge(lo, lm, le, opts: Options, stochastic: List[str], envelope: bool):
    """(agree, first failing (step, original, migrated, allowed) or None, worst ratio to the
    allowed difference, its step)."""
    xo = [x[0] for x in lo]
    xm = [x[0] for x in lm]
    xe = [x[0] for x in le]
    idx = [i for i in range(len(xo)) if xo[i] is not None and xm[i] is not None]
    if stochastic:
        ao = _moving([xo[i] for i in idx], WINDOW)
        am = _moving([xm[i] for i in idx], WINDOW)
        eidx = [i for i in idx if i < len(xe) and xe[i] is not None]
        ae = _moving([xe[i] for i in eidx], WINDOW) if envelope and len(eidx) == len(idx) else None
    else:
        ao, am = [xo[i] for i in idx], [xm[i] for i in idx]
        ae = [xe[i] for i in idx] if envelope and all(i < len(xe) and xe[i] is not None for i in idx) else None
    running = 0.0
    worst, at, first = 0.0, None, None
    for j, i in enumerate(idx):
        d = _rel(ao[j], am[j])
        if ae is not None:
            running = max(running, _rel(ao[j], ae[j]))
            allowed = max(opts.rtol, ENVELOPE_FACTOR * running)
        else:
            allowed = opts.stochastic_rtol if stochastic else opts.rtol
        ratio = d / allowed if allowed > 0 else (0.0 if d == 0 else math.inf)
        if ratio > worst or at is None:
            worst, at = ratio, i + 1
        if ratio > 1 and first is None:
            first = (i + 1, ao[j], am[j], allowed)
    return first is None, first, worst, at


def _failure(run: RunResult, opts: Options, problems: List[str], details: Dict[str, Any]) -> None:
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
    from dp2ddp.verify.checkpoint_files import strip_ansi

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
        problems.append(f"{label} run crashed (exit code {run.exit_code}): {who} raised {err['type']}: {_first_line(err['message'])}")
        crash.update(rank=rank, type=err["type"], message=err["message"], traceback=err["traceback"])
        text = err["traceback"]
        others = [e for e in errors if e is not err]
        if others:
            crash["other_ranks"] = [f"{e['type']}: {_first_line(e['message'])}" for e in others]
    else:
        fatal = next(((rank, r.fatal) for rank, r in sorted(run.ranks.items()) if r.fatal.strip()), None)
        tail = strip_ansi(run.log_tail(30))
        if fatal:
            crash.update(rank=fatal[0], traceback=fatal[1])
            problems.append(f"{label} run crashed (exit code {run.exit_code}): rank {fatal[0]} died of a fatal signal")
        else:
            problems.append(f"{label} run failed (exit code {run.exit_code}); its output ends with:")
            problems.extend("  " + line for line in tail.splitlines()[-8:])
        crash["log_tail"] = tail
        text = tail + (fatal[1] if fatal else "")
    tips = advise(text, distributed=distributed)
    crash["advice"] = tips
    problems.extend("  advice: " + t for t in tips)
    details.setdefault("crashes", []).append(crash)


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


def _first_line(s: str) -> str:
    s = s.strip().splitlines()
    return s[0] if s else ""


def compare(orig: RunResult, mig: RunResult, opts: Options, envelope: Optional[RunResult] = None) -> Dict[str, Any]:
    """One pair of runs: failures, losses, global batch, set_epoch, replicas, and this
    pair's speed-up (a figure only: the speed verdict is :func:`combine`'s, over pairs)."""
    problems: List[str] = []
    notes: List[str] = []
    details: Dict[str, Any] = {}
    for run in (mig, orig):
        _failure(run, opts, problems, details)

    raced = details.get("exit_race", [])  # found by _failure: its logs are read once
    notes.extend(EXIT_RACE_NOTE.format(role=role) for role in raced)

    def failed(run: RunResult) -> bool:
        return run.hung or (run.exit_code != 0 and run.role not in raced)

    po, pm = _per_step(orig), _per_step(mig)
    for run, per in ((orig, po), (mig, pm)):
        if not per and run.exit_code == 0 and not run.hung:
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
    if any((r.end or {}).get("random_steps") for r in orig.ranks.values()):
        if _aligned_draws(orig, mig):
            notes.append("the training step draws random numbers, and every rank's generator was where the original's "
                         "was at each of the first steps (each rank drew what the original drew, as dp2ddp's migration "
                         "of per-sample noise does): the draws are the original's, judged as exactly as the rest")
        else:
            stochastic.append("random")  # the training step draws random numbers: see _judge's moving average
    if mig.ranks and any(r.steps for r in mig.ranks.values()) and "ddp" not in kinds:
        problems.append("no DistributedDataParallel module was seen in the migrated run's forward pass")

    n = min(len(po), len(pm))
    judged = judge_losses(orig, mig, envelope, opts, stochastic, n, problems, notes)
    lo = [x[0] for x in po[:n]]
    lm = [x[0] for x in pm[:n]]
    pairs = [(a, b) for a, b in zip(lo, lm) if a is not None and b is not None]
    diffs = [_rel(a, b) for a, b in pairs]
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
    replicas_in_sync = bool(hashes) and len(ends) == len(hashes) and None not in hashes.values() and len(set(hashes.values())) == 1
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
    )

    def side(run: RunResult, per, sps):
        return {
            "steps": len(per),
            "samples_per_s": sps,
            "wall_s": round(run.wall_s, 3),
            "exit_code": run.exit_code,
            "hung": run.hung,
            "ranks": len(run.ranks),
        }

    report: Dict[str, Any] = {
        "verdict": "pass" if passed else "fail",
        "losses_agree": losses_agree,
        "max_rel_loss_diff": max_rel,
        "steps_compared": steps_compared,
        "replicas_in_sync": replicas_in_sync,
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
