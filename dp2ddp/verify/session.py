"""The runs of one verify: pairs of runs in alternating order, a warm-up pair, a time
budget, and what each run of the first pair leaves behind.

Pair k runs both scripts, each in a fresh mirror of its folder (``pair<k>/original``,
``pair<k>/migrated``; the probe's records and the logs in ``pair<k>/probe``): a script that
resumes from its own checkpoint must not find the previous run's. The first pair runs the
migration first (the original's sampler order needs the seeds the migrated run's
DistributedSamplers used and the epochs they were iterated with: :func:`sampler_plans`);
after that the order alternates (M O, O M, M O, ...), so a steady drift of the machine, or
a run that warms a cache for the next, favours neither side.

Every pair is compared in full (losses, replicas, failures), so a migration that only
sometimes diverges or hangs is caught; the first pair that fails ends the repetition. The
outputs are compared once, on the first pair.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from dp2ddp.verify import analyze, outputs, runner, scratch as scratch_mod, speed

AUTO_PAIRS = 3  # measured pairs by default ...
AUTO_BUDGET_S = 120.0  # ... while the runs so far plus one more pair fit in this
WARMUP_PAIR_S = 30.0  # a first pair shorter than this is a warm-up when more pairs follow


@dataclass
class Setup:
    scratch: Path
    original: Path
    migrated: Path
    migrated_content: Optional[bytes]
    args: List[str]
    tag: str
    steps: int
    timeout: float
    startup_timeout: float
    seed: int
    nproc: int
    nnodes: int
    threads: Dict[str, Any]
    repeat: Optional[int]  # None: the default (AUTO_PAIRS within AUTO_BUDGET_S)
    opts: analyze.Options


@dataclass
class Pair:
    index: int
    order: Tuple[str, str]
    runs: Dict[str, runner.RunResult] = field(default_factory=dict)
    report: Dict[str, Any] = field(default_factory=dict)
    warmup: bool = False
    wall_s: float = 0.0
    folder: Optional[Path] = None


@dataclass
class Outcome:
    pairs: List[Pair]
    outputs: Optional[Dict[str, Any]]
    notes: List[str]
    mirror: scratch_mod.Mirror
    migrated_script: Path  # in the first pair's folder


def run(setup: Setup, progress) -> Outcome:
    """Run pairs until enough are measured, one fails, or the default's time is spent.
    Raises ``runner.Interrupted`` (or ``KeyboardInterrupt`` between runs) on Ctrl-C."""
    mirror = scratch_mod.Mirror()
    want = setup.repeat or AUTO_PAIRS
    pairs: List[Pair] = []
    notes: List[str] = []
    outs: Optional[Dict[str, Any]] = None
    samplers: List[Dict[str, Any]] = []
    first_script: Optional[Path] = None
    t0 = time.monotonic()
    while True:
        k = len(pairs) + 1
        pair = Pair(index=k, order=("migrated", "original") if k % 2 else ("original", "migrated"))
        pair.folder = setup.scratch / f"pair{k}"
        shutil.rmtree(pair.folder, ignore_errors=True)  # left by an earlier verify in the same --workdir
        start = time.monotonic()
        scripts = {
            "original": scratch_mod.prepare(setup.original, pair.folder / "original", mirror=mirror),
            "migrated": scratch_mod.prepare(setup.migrated, pair.folder / "migrated", setup.migrated_content, mirror=mirror),
        }
        if first_script is None:
            first_script = scripts["migrated"]
        seen: Dict[str, outputs.RunOutputs] = {}
        for role in pair.order:
            script = scripts[role]
            watch = outputs.Watch(script.parent, setup.args) if k == 1 else None
            spec = runner.RunSpec(
                role=role,
                script=script,
                args=list(setup.args),
                cwd=script.parent,
                out=pair.folder / "probe",
                tag=setup.tag,
                steps=setup.steps,
                timeout=setup.timeout,
                startup_timeout=setup.startup_timeout,
                seed=setup.seed,
                samplers=samplers if role == "original" else [],
                nproc=setup.nproc if role == "migrated" else 1,
                nnodes=setup.nnodes if role == "migrated" else 1,
                env=speed.thread_env(setup.threads[role]),
            )
            progress.begin(role, _how(role, setup), f"pair {k}")
            result = runner.run(spec, progress.update)
            progress.end(result)
            pair.runs[role] = result
            if watch is not None:
                seen[role] = watch.after(result)
            if role == "migrated" and k == 1:
                samplers = sampler_plans(result)
        pair.wall_s = time.monotonic() - start
        pair.report = analyze.compare(pair.runs["original"], pair.runs["migrated"], setup.opts)
        pairs.append(pair)
        if k == 1:
            outs = _outputs(seen, pair, setup)

        if k > 1 and pair.report["verdict"] == "pass":
            _tidy(pair)

        # what next
        if pair.report["verdict"] == "fail":
            break
        if k == 1 and outs is not None and any(d["severity"] == "problem" for d in outs["differences"]):
            break
        if pair.report["speedup"] is None:
            if k == 1 and want > 1:
                notes.append("one pair only: its runs had no steady-state throughput to repeat (raise --steps)")
            break
        if k == 1 and want > 1 and pair.wall_s < WARMUP_PAIR_S:
            pair.warmup = True
        measured = [p for p in pairs if not p.warmup]
        if len(measured) >= want:
            break
        elapsed = time.monotonic() - t0
        per_pair = elapsed / len(pairs)
        if setup.repeat is None and elapsed + per_pair > AUTO_BUDGET_S:
            if not measured:  # the warm-up pair is all there is: it counts after all
                pair.warmup = False
                measured = [pair]
            notes.append(
                f"speed measured over {len(measured)} pair{'s' if len(measured) > 1 else ''}: a pair takes about "
                f"{per_pair:.0f} s and the default stops adding pairs after {AUTO_BUDGET_S:.0f} s "
                f"(--repeat N measures N)"
            )
            break
    if pairs[0].warmup:
        notes.append(
            f"pair 1 was a warm-up (its runs took {pairs[0].wall_s:.0f} s < {WARMUP_PAIR_S:.0f} s): compared, "
            "but its speed is not counted"
        )
    return Outcome(pairs=pairs, outputs=outs, notes=notes, mirror=mirror, migrated_script=first_script)


MAX_PLANS = 64  # samplers handed to the original run ...
MAX_EPOCHS = 1000  # ... and iterations of each


def sampler_plans(run: runner.RunResult) -> List[Dict[str, Any]]:
    """What the original run's shuffling RandomSamplers follow (the probe's
    ``DP2DDP_VERIFY_SAMPLERS``): the migrated run's shuffling DistributedSamplers, as its
    lowest rank iterated them, in the order of their first iteration, each with its
    dataset length, seed and the epoch of every iteration (``set_epoch`` may start at 1,
    or at a resumed epoch). The probe gives each RandomSampler the first plan not yet
    taken with the same dataset length."""
    ranks = sorted(run.ranks.values(), key=lambda r: r.rank)
    if not ranks:
        return []
    plans: Dict[Any, Dict[str, Any]] = {}
    for ev in ranks[0].samplers:
        if ev.get("kind") != "distributed" or not ev.get("shuffle", True):
            continue
        key = ev.get("id", len(plans))
        plan = plans.get(key)
        if plan is None:
            if len(plans) >= MAX_PLANS:
                continue
            plan = plans[key] = {"n": ev.get("n"), "seed": int(ev.get("seed") or 0), "epochs": []}
        if "epoch" in ev and len(plan["epochs"]) < MAX_EPOCHS:
            plan["epochs"].append(int(ev["epoch"]))
    return list(plans.values())


def _outputs(seen: Dict[str, outputs.RunOutputs], pair: Pair, setup: Setup) -> Dict[str, Any]:
    """The first pair's outputs compared; a comparison that fails on an unexpected file
    costs its section, not the verification."""
    failed = sorted({c["role"] for c in pair.report.get("crashes", [])} | ({pair.report["hang"]["role"]} if "hang" in pair.report else set()))
    if failed:  # what a crashed or hung run did not write is no finding of its own
        why = f"not compared: the {' and the '.join(failed)} run did not finish"
        return {"equal": None, "files": [], "differences": [], "notes": [], "roots": [], "summary": why}
    dp = any("dp" in (r.steps[0].get("modules") or []) for r in pair.runs["original"].ranks.values() if r.steps)
    try:
        return outputs.compare(seen["original"], seen["migrated"], setup.nproc * setup.nnodes, dp, setup.steps)
    except Exception as e:  # noqa: BLE001
        note = f"the outputs could not be compared ({type(e).__name__}: {e})"
        return {"equal": None, "files": [], "differences": [], "notes": [note], "roots": [], "summary": "not compared"}


def _tidy(pair: Pair) -> None:
    """Remove the script folders of a passed pair after the first: their outputs are not
    compared, and a script that writes large checkpoints would fill the disk pair by pair.
    Its logs and the probe's records (``pair<k>/probe``) stay."""
    for role in ("original", "migrated"):
        shutil.rmtree(pair.folder / role, ignore_errors=True)


def _how(role: str, setup: Setup) -> str:
    threads = setup.threads[role]
    t = f"{threads} thread{'s' if threads != 1 else ''} each"
    if role == "original":
        return f"python, {t}"
    return f"torchrun, {setup.nnodes} node(s) x {setup.nproc} process(es), {t}"
