"""The runs of one verify: pairs of runs in alternating order, a warm-up pair, a time
budget, and what each run of the first pair leaves behind.

Pair k runs both scripts, each in a fresh copy of the project (``pair<k>/original``,
``pair<k>/migrated``; the probe's records and the logs in ``pair<k>/probe``): a script that
resumes from its own checkpoint must not find the previous run's. The first pair runs the
migration first (the original's sampler order needs the seeds the migrated run's
DistributedSamplers and ShardedBatches used and the epochs they were iterated with:
:func:`sampler_plans`); after that the order alternates (M O, O M, M O, ...), so a steady
drift of the machine, or a run that warms a cache for the next, favours neither side.

The first pair's migrated run goes on past ``--steps`` until its training loader has begun
its second epoch (at most ``extend`` steps), so that the data evidence holds two epochs; the
original then runs as many steps. The first pair also runs the original a third time, with
each batch split into world-size chunks (``pair1/envelope``): how far float noise alone
moves the losses and the checkpoints is what the migration is judged against.

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

from dp2ddp.verify import analyze, failures, losses, options, outputs, run_files, runner, scratch as scratch_mod, speed

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
    opts: options.Options
    root: Optional[Path] = None  # the user's project (default: the original's folder)
    cwd: Optional[Path] = None  # where the runs start, in the user's project (default: the script's folder)
    extend: int = 0  # the evidence: go on to the training loader's second epoch, up to this many steps
    envelope: bool = True  # measure the noise envelope (a third run in the first pair)
    # a project migration (rewrite --with-helpers): the migrated project modules (paths relative
    # to ``root``) the migrated runs see instead of the project's own
    overlays: Dict[Path, bytes] = field(default_factory=dict)


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
    root = setup.root or setup.original.parent
    world = setup.nproc * setup.nnodes
    steps_first = setup.steps
    t0 = time.monotonic()
    while True:
        k = len(pairs) + 1
        pair = Pair(index=k, order=("migrated", "original") if k % 2 else ("original", "migrated"))
        pair.folder = setup.scratch / f"pair{k}"
        shutil.rmtree(pair.folder, ignore_errors=True)  # left by an earlier verify in the same --workdir
        roles = list(pair.order)
        if k == 1 and setup.envelope and world > 1:
            roles.append("envelope")
        places = {role: _place(setup, role, pair.folder / role, mirror, root) for role in roles}
        if first_script is None:
            first_script = places["migrated"].script
        seen: Dict[str, run_files.RunOutputs] = {}
        took: Dict[str, float] = {}
        for role in roles:
            if role == "envelope" and any(r.hung or r.exit_code not in (0, None) and not failures.exit_race(r)
                                          for r in pair.runs.values()):
                shutil.rmtree(pair.folder / role, ignore_errors=True)
                continue  # a failed run has no losses to judge: no envelope needed
            place = places[role]
            args = scratch_mod.remap(setup.args, root, place.root)
            syspath = [str(place.cwd), str(place.script.parent), str(place.root)]
            watch = run_files.Watch(place.root, args, cwd=place.cwd, syspath=syspath) if k == 1 else None
            probe_role = "original" if role == "envelope" else role
            env = dict(speed.thread_env(setup.threads[probe_role]))
            env.update(_guard_env(setup, place, pair.folder, role, root))
            spec = runner.RunSpec(
                role=probe_role,
                script=place.script,
                args=args,
                cwd=place.cwd,
                out=pair.folder / "probe" / ("envelope" if role == "envelope" else ""),
                tag=setup.tag,
                steps=setup.steps if (k > 1 or role == "migrated") else steps_first,
                timeout=setup.timeout,
                startup_timeout=setup.startup_timeout,
                seed=setup.seed,
                samplers=samplers if probe_role == "original" else [],
                nproc=setup.nproc if role == "migrated" else 1,
                nnodes=setup.nnodes if role == "migrated" else 1,
                env=env,
                pythonpath=[str(place.root)],
                extend=setup.extend if (k == 1 and role == "migrated" and setup.steps) else 0,
                chunks=world if role == "envelope" else 0,
                # the original's step draws random numbers the migrated ranks did not: the envelope
                # run draws from another stream too (DP2DDP_VERIFY_REDRAW)
                redraw=role == "envelope" and losses.step_draws(pair.runs["original"], pair.runs["migrated"]) == "apart",
            )
            progress.begin(role, _how(role, setup), f"pair {k}")
            began = time.monotonic()
            result = runner.run(spec, progress.update)
            took[role] = time.monotonic() - began
            result.root = place.root
            progress.end(result)
            pair.runs[role] = result
            if watch is not None:
                seen[role] = watch.after(result, work=pair.folder / "probe")
            if role == "migrated" and k == 1:
                samplers = sampler_plans(result)
                steps_first = stop_step(result, setup.steps)
        pair.wall_s = sum(took[r] for r in pair.order)  # the envelope's run is no part of the pair's time
        pair.report = analyze.compare(pair.runs["original"], pair.runs["migrated"], setup.opts,
                                      envelope=pair.runs.get("envelope"))
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
    shutil.rmtree(setup.scratch / "pair1" / "envelope", ignore_errors=True)  # compared: not needed any more
    if pairs[0].warmup:
        notes.append(
            f"pair 1 was a warm-up (its runs took {pairs[0].wall_s:.0f} s < {WARMUP_PAIR_S:.0f} s): compared, "
            "but its speed is not counted"
        )
    return Outcome(pairs=pairs, outputs=outs, notes=notes, mirror=mirror, migrated_script=first_script)


def _place(setup: Setup, role: str, dest: Path, mirror: scratch_mod.Mirror, root: Path) -> scratch_mod.Place:
    """The run's copy of the project, its script placed where the user's is (the migration
    beside the original when it lies outside the project, or when verify rewrote it)."""
    cwd = setup.cwd or setup.original.parent
    if role == "migrated":
        script, content = setup.migrated, setup.migrated_content
        inside = script == root or root in script.parents
        at = script.relative_to(root) if inside and content is None else setup.original.relative_to(root).with_name(script.name)
        return scratch_mod.prepare(script, dest, content, mirror=mirror, root=root, cwd=cwd, at=at,
                                   overlays=setup.overlays)
    return scratch_mod.prepare(setup.original, dest, mirror=mirror, root=root, cwd=cwd)


def _guard_env(setup: Setup, place: scratch_mod.Place, folder: Path, role: str, root: Path) -> Dict[str, str]:
    """What the probe's write guard needs: the run's copy, the user's project, a lock; and
    the user's PYTHONPATH with entries in the project pointed at the copy."""
    import os

    env = {
        "DP2DDP_VERIFY_MIRROR": str(place.root),
        "DP2DDP_VERIFY_PROJECT": str(root),
        "DP2DDP_VERIFY_SCRATCH": str(setup.scratch),
        "DP2DDP_VERIFY_LOCK": str(folder / f".lock-{role}"),
    }
    old = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if old:
        env["PYTHONPATH"] = os.pathsep.join(scratch_mod.remap(old, root, place.root))
    return env


def stop_step(run: runner.RunResult, steps: int) -> int:
    """The step the first migrated run stopped at (past --steps for the evidence): the
    original runs as many; --steps when the run ended by itself."""
    ends = [r.end for r in run.ranks.values() if r.end]
    if steps and ends and all(e.get("why") == "limit" for e in ends):
        return max(int(e.get("steps") or steps) for e in ends)
    return steps


MAX_PLANS = 64  # samplers handed to the original run ...
MAX_EPOCHS = 1000  # ... and iterations of each


def sampler_plans(run: runner.RunResult) -> List[Dict[str, Any]]:
    """What the original run's loaders follow (the probe's ``DP2DDP_VERIFY_SAMPLERS``): the
    migrated run's shuffling DistributedSamplers and its ShardedBatches, as its lowest rank
    iterated them, in the order of their first iteration, each with its dataset length,
    seed and the epoch of every iteration (``set_epoch`` may start at 1, or at a resumed
    epoch). The probe gives each RandomSampler the first DistributedSampler plan not yet
    taken with the same dataset length, and each loader the first ShardedBatches plan with
    the same dataset length and number of batches."""
    ranks = sorted(run.ranks.values(), key=lambda r: r.rank)
    if not ranks:
        return []
    plans: Dict[Any, Dict[str, Any]] = {}
    for ev in ranks[0].samplers:
        sharded = ev.get("kind") == "sharded"
        if not sharded and (ev.get("kind") != "distributed" or not ev.get("shuffle", True)):
            continue
        key = (ev.get("kind"), ev.get("id", len(plans)))
        plan = plans.get(key)
        if plan is None:
            if len(plans) >= MAX_PLANS:
                continue
            plan = plans[key] = {"n": ev.get("n"), "seed": int(ev.get("seed") or 0), "epochs": []}
            if sharded:
                plan = plans[key] = {"kind": "sharded", "n": ev.get("n"), "batches": ev.get("batches"),
                                     "seed": int(ev.get("seed") or 0), "epochs": []}
        if "epoch" in ev and len(plan["epochs"]) < MAX_EPOCHS:
            plan["epochs"].append(int(ev["epoch"]))
    return list(plans.values())


def _outputs(seen: Dict[str, run_files.RunOutputs], pair: Pair, setup: Setup) -> Dict[str, Any]:
    """The first pair's outputs compared; a comparison that fails on an unexpected file
    costs its section, not the verification."""
    failed = sorted({c["role"] for c in pair.report.get("crashes", [])} | ({pair.report["hang"]["role"]} if "hang" in pair.report else set()))
    if failed:  # what a crashed or hung run did not write is no finding of its own
        why = f"not compared: the {' and the '.join(failed)} run did not finish"
        return {"equal": None, "files": [], "differences": [], "notes": [], "roots": [], "summary": why}
    dp = any("dp" in (r.steps[0].get("modules") or []) for r in pair.runs["original"].ranks.values() if r.steps)
    env = pair.runs.get("envelope")
    envelope = seen.get("envelope") if env is not None and env.exit_code == 0 and not env.hung else None
    steps = stop_step(pair.runs["migrated"], setup.steps)
    # the envelope run split its batches (a DataParallel forward ran in it) or, wrapping nothing
    # on this machine, perturbed the gradients: then it says nothing of BatchNorm or dropout per rank
    split = env is not None and any((r.end or {}).get("envelope") == "chunks" for r in env.ranks.values())
    stochastic = (pair.report.get("tolerance") or {}).get("why") or []
    batches = sorted({int(s.get("samples") or 0) for r in pair.runs["original"].ranks.values() for s in r.steps} - {0})
    from dp2ddp.model.checkpoint_keys import checkpoint_readers

    try:
        return outputs.compare(seen["original"], seen["migrated"], setup.nproc * setup.nnodes, dp, steps, envelope=envelope,
                               values=bool(pair.report.get("losses_agree") or (pair.report.get("inference") or {}).get("agree")), split=split, stochastic=stochastic,
                               batches=batches, readers=checkpoint_readers(str(setup.original)))
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
    threads = setup.threads["original" if role == "envelope" else role]
    t = f"{threads} thread{'s' if threads != 1 else ''} each"
    if role == "envelope":
        return (f"python, the original again with each batch in {setup.nproc * setup.nnodes} chunks where DataParallel "
                f"splits it, else its gradients perturbed: the noise envelope, {t}")
    if role == "original":
        return f"python, {t}"
    return f"torchrun, {setup.nnodes} node(s) x {setup.nproc} process(es), {t}"
