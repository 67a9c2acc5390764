"""The losses of an original run and its migration judged step by step: each migrated
step against the original's within the tolerance, or the noise envelope's run (the
original again, its batches in chunks) times :data:`ENVELOPE_FACTOR` where it ran
(:func:`judge_losses`), over a moving average of :data:`WINDOW` steps; per optimizer."""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

from dp2ddp.verify import partition
from dp2ddp.verify.options import Options
from dp2ddp.verify.runner import RunResult


WINDOW = 5  # steps in the moving average of the tolerance path


ENVELOPE_FACTOR = 10.0  # a step's loss may differ this many times the noise envelope at that step ...
# ... and, where the training step draws random numbers, its moving average this many times
# as far as the original's moved when it drew other numbers (the redrawn envelope), at
# least --stochastic-rtol: both are differences of two runs that drew apart, so the
# migration's may exceed the envelope's running maximum by chance, not by a factor of two
REDRAW_FACTOR = 2.0


def _moving(xs: List[float], w: int) -> List[float]:
    out = []
    for i in range(len(xs)):
        seg = xs[max(0, i - w + 1) : i + 1]
        out.append(sum(seg) / len(seg))
    return out


def relative(a: float, b: float) -> float:
    if a == b:
        return 0.0
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    return abs(a - b) / max(abs(a), abs(b), 1e-12)


def step_loss(losses: List[Optional[float]], samples: List[int]) -> Optional[float]:
    """One step's loss over the ranks: weighted by their samples where every rank counted
    them, else their plain mean; ``None`` where a rank reported none."""
    if any(v is None for v in losses):
        return None
    if all(samples):
        return sum(v * s for v, s in zip(losses, samples)) / sum(samples)  # type: ignore[operator]
    return sum(losses) / len(losses)  # type: ignore[arg-type]


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
            samples = [int(x.get("samples") or 0) for x in recs]
            seq.append((step_loss([x.get("loss") for x in recs], samples), recs[0].get("lr")))
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
    average; random draws in the step, and dropout's masks, which no run of the original
    draws as the ranks do, are judged against the envelope run that drew other numbers
    (``redrawn``: REDRAW_FACTOR times it, at least --stochastic-rtol), else by
    --stochastic-rtol alone. Without an envelope (it failed, or one process): --rtol, or
    --stochastic-rtol for BatchNorm and dropout."""
    so, sm = series(orig), series(mig)
    se = series(envelope) if envelope is not None and not envelope.hung and envelope.exit_code == 0 else {}
    method = None
    if se:
        ends = [r.end for r in envelope.ranks.values() if r.end]
        method = "chunks" if any(e.get("envelope") == "chunks" for e in ends) else "perturb"
        if method == "chunks" and any(e.get("split_at") == "model" for e in ends):
            method = "chunks-at-model"
        bn_chunks = method == "perturb" and any(e.get("bn_chunks") for e in ends)
        if method in ("chunks", "chunks-at-model") and any(e.get("regrouped") for e in ends):
            notes.append("the envelope run chunked the model's forward over views concatenated (`model(torch.cat([v1, "
                         "v2]))`) as DDP shares it, every view of each rank's samples in one chunk, not as DataParallel "
                         "splits it (the first views | the second views): BatchNorm normalises the groups the ranks do")
        if ("random" in stochastic or "dropout" in stochastic) and any(e.get("redrawn") for e in ends):
            method = "redraw"  # the envelope drew other numbers in its steps: how far that alone moves the losses
        elif "random" in stochastic or "dropout" in stochastic:
            se = {}  # each rank draws its own random numbers: no run of the original reproduces them
            notes.append("the noise envelope does not cover " + (
                "random draws in the training step" if "random" in stochastic else "dropout's masks (the chunked run "
                "draws them from the original's one stream in turn)") + " (each rank draws from its own stream, the "
                "original drew the whole batch's): --stochastic-rtol decides")
        elif method == "perturb" and stochastic == ["batchnorm"] and bn_chunks:
            method = "perturb+bn"  # the envelope run normalised each chunk on its own: per-rank statistics covered
        elif method == "perturb" and stochastic:
            se = {}  # a gradient perturbation per step says nothing of per-rank BatchNorm statistics or dropout masks
            notes.append("the noise envelope does not cover dropout (or BatchNorm it could not chunk) without "
                         "DataParallel's chunks (the original ran without DataParallel here): --stochastic-rtol decides")
    elif envelope is not None and (envelope.hung or envelope.exit_code != 0):
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
        ok, first, ratio, at = _judge(lo[:k], lm[:k], le[:k], opts, stochastic, bool(se), redrawn=method == "redraw")
        entry.update(worst_ratio=ratio, worst_step=at)
        if ratio > worst["ratio"] or worst["step"] is None:
            worst = {"ratio": ratio, "step": at, "optimizer": o}
        if not ok:
            agree = False
            a, b, allowed = first[1], first[2], first[3]
            problems.append(
                f"losses disagree from step {first[0]}" + (f" of {name}" if len(so) > 1 or o != primary else "")
                + f": original {a:.7g}, migrated {b:.7g} (relative difference {relative(a, b):.3g} > {allowed:.3g} allowed: "
                + ("the redrawn envelope's" if method == "redraw" else "the noise envelope's" if se else "the tolerance") + ")"
                + _unscaled_sum(a, b, opts)
            )
        lr_bad = next((i for i in range(k) if lo[i][1] is not None and lm[i][1] is not None and
                       relative(lo[i][1], lm[i][1]) > 1e-6), None)
        if lr_bad is not None:
            agree = False
            problems.append(f"the learning rate of {name} differs from step {lr_bad + 1}: original {lo[lr_bad][1]:.6g}, "
                            f"migrated {lm[lr_bad][1]:.6g} (a scheduler stepped per batch on each rank, or a rate scaled "
                            "by the world size)")
    if se:
        how = {"chunks": f"the original run again with each batch split into {opts.nproc * opts.nnodes} chunks by "
                         "DataParallel, their gradients summed (DDP's reduction order without DDP)",
               "chunks-at-model": f"the original run again with each batch split into {opts.nproc * opts.nnodes} chunks "
                                  "at its model's outermost call, as DataParallel would split it (the script wraps "
                                  "nothing on this machine), their gradients summed (DDP's reduction order without DDP)",
               "perturb": f"the original run again with every gradient element perturbed at each step by "
                          f"{opts.nproc * opts.nnodes} roundings (eps of its dtype) of its magnitude plus the tensor's RMS, "
                          "the reduction-order noise of an all-reduce (it ran without DataParallel, so no chunks)",
               "redraw": "the original run again, drawing the training step's random numbers from another stream from "
                         "its first training forward on (as each rank draws its own), with the data and the items' draws the "
                         "original's" + (f", each batch split into {opts.nproc * opts.nnodes} chunks by DataParallel"
                                         if any(e.get("envelope") == "chunks" for e in ends) else ""),
               "perturb+bn": f"the original run again with every BatchNorm normalising each batch in {opts.nproc * opts.nnodes} "
                             "chunks on its own (per-rank statistics) and every gradient element perturbed at each step by "
                             f"{opts.nproc * opts.nnodes} roundings of its magnitude plus the tensor's RMS (it ran without "
                             "DataParallel, so no chunks of the model's input)"}[method]
        rule = (f"{WINDOW}-step moving average within {REDRAW_FACTOR:g}x the redrawn envelope ({how}), at least "
                f"--stochastic-rtol {opts.stochastic_rtol:g}" if method == "redraw" else
                f"within {ENVELOPE_FACTOR:g}x the float-noise envelope ({how}), at least --rtol {opts.rtol:g}"
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
            + (", judged against the chunked run, which normalises each chunk alike" if method in ("chunks", "chunks-at-model") else ""),
            "dropout": "dropout masks come from each process's own random stream: a legitimate difference",
            "random": "the training step draws random numbers (mixup's permutation, a GAN's noise), each rank its "
            "share from its own stream where the original drew the whole batch's: the losses can agree only "
            "statistically",
        }
        notes.append("losses compared as a moving average: " + "; ".join(why[k] for k in stochastic))
    tolerance = {"kind": kind, "rule": rule, "why": stochastic, "rtol": opts.rtol if kind != "stochastic" else opts.stochastic_rtol,
                 "method": method, "factor": (REDRAW_FACTOR if method == "redraw" else ENVELOPE_FACTOR) if se else None, "worst_ratio": worst["ratio"] if se else None,
                 "worst_step": worst["step"]}
    return {"agree": agree, "rule": rule, "tolerance": tolerance, "optimizers": report_opts}


def _unscaled_sum(a: float, b: float, opts: Options) -> str:
    """Where the migrated loss is the original's divided by the world size: a loss summed
    over each rank's share (``reduction="sum"``) whose gradients DDP averages; the summed
    losses of the migrated script that are not scaled back, by line."""
    world = opts.nproc * opts.nnodes
    if world < 2 or not a or not math.isfinite(b) or abs(b * world / a - 1) > 1e-3:
        return ""
    where = ""
    if opts.migrated:
        try:
            from dp2ddp.model.core import build
            from dp2ddp.model.losses import summed_losses

            with open(opts.migrated, "rb") as f:
                m = build(f.read(), opts.migrated)
            name = os.path.basename(opts.migrated)
            lines = sorted({s.use.lineno for s in summed_losses(m)})
            where = f" ({', '.join(f'{name}:{n}' for n in lines[:3])})" if lines else ""
        except (OSError, SyntaxError, ValueError):
            pass
    return (f"; the migrated loss is 1/{world} of the original's: a loss summed over each rank's share{where} and not "
            "multiplied back by the world size (DDP averages the ranks' gradients; `dp2ddp rewrite` scales it with whole_sum)")


def _opt_name(o: int, info: Dict[str, Any], mig_info: Optional[Dict[str, Any]], mig: RunResult) -> str:
    kind = info.get("kind") or "optimizer"
    site = (mig_info or {}).get("site")
    where = ""
    if site:
        root = getattr(mig, "root", None)
        where = f", {partition.show_site(site, root)}"
    return f"optimizer {o} ({kind}{where})"


def step_draws(orig, mig) -> Optional[str]:
    """Whether the original's training step draws random numbers (its default generator moved
    between steps of one pass), and how the migration drew them: ``None`` (no draws),
    ``"aligned"`` (each rank drew what the original drew: :func:`aligned_draws`) or ``"apart"``
    (each rank its own: the losses agree only statistically)."""
    if not any((r.end or {}).get("random_steps") for r in orig.ranks.values()):
        return None
    return "aligned" if aligned_draws(orig, mig) else "apart"


def aligned_draws(orig, mig) -> bool:
    """Every migrated rank's default generator was in the original's state at each of the
    first steps (the probe's ``rng`` marks): whatever the steps drew, each rank drew the
    same numbers as the original, so random draws do not make the losses stochastic."""
    want = next((r.end.get("rng") for r in orig.ranks.values() if r.end and r.end.get("rng")), None)
    if not want or len(want) < 2 or not mig.ranks:
        return False
    return all(r.end and r.end.get("rng") == want for r in mig.ranks.values())


def _judge(lo, lm, le, opts: Options, stochastic: List[str], envelope: bool, redrawn: bool = False):
    """(agree, first failing (step, original, migrated, allowed) or None, worst ratio to the
    allowed difference, its step). ``redrawn``: the envelope drew the step's random numbers
    from another stream (REDRAW_FACTOR times it, at least --stochastic-rtol)."""
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
        d = relative(ao[j], am[j])
        if ae is not None:
            running = max(running, relative(ao[j], ae[j]))
            allowed = (max(opts.stochastic_rtol, REDRAW_FACTOR * running) if redrawn
                       else max(opts.rtol, ENVELOPE_FACTOR * running))
        else:
            allowed = opts.stochastic_rtol if stochastic else opts.rtol
        ratio = d / allowed if allowed > 0 else (0.0 if d == 0 else math.inf)
        if ratio > worst or at is None:
            worst, at = ratio, i + 1
        if ratio > 1 and first is None:
            first = (i + 1, ao[j], am[j], allowed)
    return first is None, first, worst, at
