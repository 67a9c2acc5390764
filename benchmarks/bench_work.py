"""Benchmark: the migrated run does no more work than a careful hand migration (issue 20).

    python benchmarks/bench_work.py [--repeats 5] [--shapes accumulation,...] [--json out.json]
    python benchmarks/bench_work.py --shapes evaluation --json benchmarks/results/eval-cpu.json

For each shape (a DataParallel script and the same script migrated to DDP by hand,
``fixtures/work/<shape>.py`` and ``<shape>_hand.py``): the script is migrated with
`dp2ddp rewrite`'s engine, then the migration and the hand migration run under
``torchrun --nproc_per_node=2`` on CPU (gloo), ``--repeats`` times each, interleaved (the
order alternates from pair to pair), with ``tests/work_probe`` counting from outside the
processes. Reported per shape:

* samples processed per rank per epoch (the batch dimension of every training forward),
  against N / world: target N / world, plus at most ``padding`` (a batch that does not
  divide by the world size is padded);
* gradient all-reduces per optimizer step (a DDP communication hook): target 1 where the
  shape says so (gradient accumulation);
* wall time: the whole run (``torchrun`` start to exit) and the training (the probe: first
  training forward to the last optimizer step, the slower rank); and the CPU time the
  ranks used in training (summed), which what else runs on a shared machine disturbs less.
  Each pair gives a speed ratio ``hand time / migrated time`` (above 1: the migration is
  faster); the median over the pairs and a 95% bootstrap interval of that median are
  reported. Target: >= 0.97 (on the training wall time).

Adding a shape is one ``Shape`` entry and its script pair; tests/test_work.py runs every
entry too (small: ``test_args``).

The ``evaluation`` shape (``EvalShape``, ``fixtures/work/evaluation.py``) compares two
migrations of one script instead: the default one (every rank evaluates the whole set) and
``rewrite --shard-eval`` (each rank evaluates its own whole batches), interleaved in the
same way. Reported: the samples each rank's evaluation forwards received per pass (the
probe; target: N / world, within one batch), the evaluation wall time (the script times each
pass on each rank; a pass takes as long as its slower rank, summed over the passes), the
ratio ``whole time / sharded time`` (median and 95% interval over the pairs), and whether
the sharded run printed the whole run's metrics exactly (``repr``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "fixtures" / "work"
PROBE = ROOT / "tests" / "work_probe"
WORLD = 2
TARGET_SPEED = 0.97


@dataclass
class Shape:
    name: str  # fixtures/work/<name>.py (DataParallel) and <name>_hand.py (the hand migration)
    args: List[str]  # arguments of both, sized so that training takes seconds
    samples: int  # N: what the original processes in one epoch (along the batch dimension)
    epochs: int
    dim: int = 0  # the batch dimension of the model's input
    allreduces_per_step: Optional[float] = None  # the target, where the shape has one
    padding: int = 0  # samples per rank per epoch a padded last batch may add
    notes: str = ""
    # the same shape, small, for tests/test_work.py: its arguments and N of one epoch
    test_args: List[str] = field(default_factory=list)
    test_samples: int = 0


SHAPES: List[Shape] = [
    Shape("accumulation", ["--samples", "8192", "--batch_size", "64", "--gradient_accumulation_steps", "4",
                           "--width", "256", "--epochs", "2"], samples=8192, epochs=2, allreduces_per_step=1,
          notes="DataLoader, loss / accum, optimizer.step() every 4 backward passes",
          test_args=["--samples", "256", "--epochs", "2"], test_samples=256),
    Shape("hand_batches", ["--samples", "8192", "--batch_size", "64", "--width", "256", "--epochs", "2"],
          samples=8192, epochs=2, allreduces_per_step=1, notes="batches cut by index from a seeded permutation",
          test_args=["--samples", "256", "--epochs", "2"], test_samples=256),
    Shape("dim1_lm", ["--tokens", "32000", "--batch_size", "16", "--bptt", "20", "--nhid", "128", "--epochs", "2"],
          samples=16 * 100, epochs=2, dim=1, allreduces_per_step=1,
          notes="DataParallel(dim=1) LSTM LM: (seq_len, batch) columns; samples = columns x steps",
          test_args=["--tokens", "1600", "--epochs", "2"], test_samples=8 * 10),
]


@dataclass
class EvalShape:
    name: str  # fixtures/work/<name>.py (DataParallel), migrated twice: whole and --shard-eval
    args: List[str]
    samples: int  # N: the evaluation set
    batch: int  # its batch size
    passes: int  # evaluations per run
    notes: str = ""


EVAL_SHAPES: List[EvalShape] = [
    EvalShape("evaluation", ["--train-samples", "1024", "--eval-samples", "65536", "--eval-batch-size", "256",
                             "--width", "512", "--epochs", "3"], samples=65536, batch=256, passes=3,
              notes="test(epoch) after every epoch: test_loss += loss.item() * n, correct, total"),
]


def _env(out: Path, dim: int) -> Dict[str, str]:
    env = dict(os.environ)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env.update(PYTHONPATH=str(PROBE), DP2DDP_WORK_OUT=str(out), DP2DDP_WORK_DIM=str(dim), OMP_NUM_THREADS="1")
    return env


def _launch(script: Path, shape, out: Path) -> dict:
    """One run under torchrun; the facts of each rank and the wall time."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}", script.name, *shape.args]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=script.parent, env=_env(out, getattr(shape, "dim", 0)), capture_output=True, text=True,
                       timeout=1800)
    wall = time.perf_counter() - t
    if r.returncode != 0:
        raise SystemExit(f"{script.name} failed (exit {r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    ranks = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    if sorted(ranks) != [f"rank{i}" for i in range(WORLD)]:
        raise SystemExit(f"{script.name}: the probe reported {sorted(ranks)}")
    return {
        "wall_s": wall,
        "train_s": max(f.get("train_s", 0.0) for f in ranks.values()),
        "train_cpu_s": sum(f.get("train_cpu_s", 0.0) for f in ranks.values()),
        "ranks": ranks,
        "stderr": r.stderr,
    }


def _median_interval(values: List[float], seed: int = 0, draws: int = 2000) -> dict:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return {
        "median": statistics.median(values),
        "ci95": [medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]],
        "values": values,
    }


def _counts(run: dict, shape: Shape) -> dict:
    ranks = run["ranks"]
    per_epoch = {r: f["samples"] / shape.epochs for r, f in ranks.items()}
    per_step = {r: (f["reductions"] / f["steps"] if f["steps"] else None) for r, f in ranks.items()}
    return {
        "samples_per_rank_per_epoch": per_epoch,
        "steps": {r: f["steps"] for r, f in ranks.items()},
        "allreduces_per_step": per_step,
        "replicas_equal": len({f.get("params") for f in ranks.values()}) == 1,
    }


def bench(shape: Shape, repeats: int, work: Path) -> dict:
    from dp2ddp.migrate import migrate_source

    folder = work / shape.name
    folder.mkdir(parents=True)
    original = SCRIPTS / f"{shape.name}.py"
    result = migrate_source(original.read_bytes(), original.name)
    if result.migration.blocked or not result.changed:
        raise SystemExit(f"{shape.name}: the migration was refused: {[f.message for f in result.migration.findings]}")
    scripts = {"migrated": folder / f"{shape.name}_ddp.py", "hand": folder / f"{shape.name}_hand.py"}
    scripts["migrated"].write_bytes(result.output)
    shutil.copy(SCRIPTS / f"{shape.name}_hand.py", scripts["hand"])
    runs: Dict[str, List[dict]] = {"migrated": [], "hand": []}
    for i in range(repeats):
        order = ("migrated", "hand") if i % 2 == 0 else ("hand", "migrated")
        for tag in order:
            runs[tag].append(_launch(scripts[tag], shape, folder / f"{tag}-{i}"))
            last = runs[tag][-1]
            print(f"  {shape.name} {tag} #{i}: wall {last['wall_s']:.2f} s, training {last['train_s']:.2f} s "
                  f"({last['train_cpu_s']:.2f} s CPU)", file=sys.stderr)
    expected = shape.samples / WORLD
    counts = {tag: _counts(runs[tag][0], shape) for tag in runs}
    speed = {
        what: _median_interval([h[what] / m[what] for m, h in zip(runs["migrated"], runs["hand"])])
        for what in ("wall_s", "train_s", "train_cpu_s")
    }
    mig = counts["migrated"]
    checks = {
        "samples_per_rank": all(expected <= v <= expected + shape.padding for v in mig["samples_per_rank_per_epoch"].values()),
        "steps_as_hand": mig["steps"] == counts["hand"]["steps"],
        "replicas_equal": mig["replicas_equal"],
        "speed_ratio_train": speed["train_s"]["median"] >= TARGET_SPEED,
    }
    if shape.allreduces_per_step is not None:
        checks["allreduces_per_step"] = all(v == shape.allreduces_per_step for v in mig["allreduces_per_step"].values())
    return {
        "shape": asdict(shape),
        "migration_warnings": [f"{f.line}: {f.code} {f.message}" for f in result.migration.warnings],
        "expected_samples_per_rank_per_epoch": expected,
        "counts": counts,
        "wall_s": {tag: [r["wall_s"] for r in runs[tag]] for tag in runs},
        "train_s": {tag: [r["train_s"] for r in runs[tag]] for tag in runs},
        "train_cpu_s": {tag: [r["train_cpu_s"] for r in runs[tag]] for tag in runs},
        "speed_ratio_hand_over_migrated": speed,
        "checks": checks,
        "pass": all(checks.values()),
    }


def _passes(stderr: str) -> Dict[str, Dict[str, tuple]]:
    """``EVAL <rank> <epoch> <seconds> <metrics>`` lines: epoch -> rank -> (seconds, metrics repr)."""
    out: Dict[str, Dict[str, tuple]] = {}
    for line in stderr.splitlines():
        at = line.find("EVAL ")
        if at < 0:
            continue
        rank, epoch, seconds, metrics = line[at + 5:].split(" ", 3)
        out.setdefault(epoch, {})[rank] = (float(seconds), metrics.strip())
    return out


def bench_eval(shape: EvalShape, repeats: int, work: Path) -> dict:
    from dp2ddp.migrate import Options, migrate_source

    folder = work / shape.name
    folder.mkdir(parents=True)
    original = SCRIPTS / f"{shape.name}.py"
    scripts = {}
    warnings = {}
    for tag, options in (("whole", Options()), ("sharded", Options(shard_eval=True))):
        result = migrate_source(original.read_bytes(), original.name, options)
        if result.migration.blocked or not result.changed:
            raise SystemExit(f"{shape.name}: the migration was refused: {[f.message for f in result.migration.findings]}")
        scripts[tag] = folder / f"{shape.name}_{tag}.py"
        scripts[tag].write_bytes(result.output)
        warnings[tag] = [f"{f.line}: {f.code} {f.message}" for f in result.migration.warnings]
    if b"EvalPass(" not in scripts["sharded"].read_bytes():
        raise SystemExit(f"{shape.name}: --shard-eval did not shard its evaluation loop")
    runs: Dict[str, List[dict]] = {"whole": [], "sharded": []}
    for i in range(repeats):
        order = ("sharded", "whole") if i % 2 == 0 else ("whole", "sharded")
        for tag in order:
            run = _launch(scripts[tag], shape, folder / f"{tag}-{i}")
            run["passes"] = _passes(run.pop("stderr"))
            run["eval_s"] = sum(max(s for s, _ in ranks.values()) for ranks in run["passes"].values())
            runs[tag].append(run)
            print(f"  {shape.name} {tag} #{i}: wall {run['wall_s']:.2f} s, evaluation {run['eval_s']:.2f} s", file=sys.stderr)
    per_pass = {tag: {r: f["eval_samples"] / shape.passes for r, f in runs[tag][0]["ranks"].items()} for tag in runs}
    metrics_equal = all(
        len({m for _, m in ranks.values()} | {m for _, m in w[epoch].values()}) == 1
        for s, w in zip((r["passes"] for r in runs["sharded"]), (r["passes"] for r in runs["whole"]))
        for epoch, ranks in s.items()
    )
    speed = {what: _median_interval([w[what] / s[what] for s, w in zip(runs["sharded"], runs["whole"])])
             for what in ("eval_s", "wall_s")}
    expected = shape.samples / WORLD
    checks = {
        "samples_per_rank": all(abs(v - expected) <= shape.batch for v in per_pass["sharded"].values()),
        "whole_samples_per_rank": all(v == shape.samples for v in per_pass["whole"].values()),
        "metrics_equal": metrics_equal,
        "passes": all(len(r["passes"]) == shape.passes for tag in runs for r in runs[tag]),
    }
    return {
        "shape": asdict(shape),
        "migration_warnings": warnings,
        "expected_samples_per_rank_per_pass": expected,
        "eval_samples_per_rank_per_pass": per_pass,
        "eval_s": {tag: [r["eval_s"] for r in runs[tag]] for tag in runs},
        "wall_s": {tag: [r["wall_s"] for r in runs[tag]] for tag in runs},
        "metrics": {tag: runs[tag][0]["passes"] for tag in runs},
        "speed_ratio_whole_over_sharded": speed,
        "checks": checks,
        "pass": all(checks.values()),
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shapes", help="comma-separated names (default: all)")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    shapes = SHAPES if not args.shapes else [s for s in SHAPES if s.name in args.shapes.split(",")]
    eval_shapes = EVAL_SHAPES if not args.shapes else [s for s in EVAL_SHAPES if s.name in args.shapes.split(",")]
    import torch

    report: dict = {
        "command": "python benchmarks/bench_work.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
                    "load_average_at_start": list(os.getloadavg()), "platform": platform.platform()},
        "world_size": WORLD,
        "backend": "gloo (CPU), OMP_NUM_THREADS=1",
        "speed_ratio": "hand migration's time / migrated run's time, per interleaved pair (1 = as fast; target >= 0.97 "
                       "on the training wall time); train_cpu_s: CPU time of both ranks in training, summed",
        "shapes": {},
        "evaluation": {},
    }
    work = Path(tempfile.mkdtemp(prefix="bench_work_"))
    try:
        for shape in shapes:
            print(f"{shape.name}: {args.repeats} interleaved pairs", file=sys.stderr)
            report["shapes"][shape.name] = bench(shape, args.repeats, work)
        for eshape in eval_shapes:
            print(f"{eshape.name}: {args.repeats} interleaved pairs (whole / --shard-eval)", file=sys.stderr)
            report["evaluation"][eshape.name] = bench_eval(eshape, args.repeats, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report["load_average_at_end"] = list(os.getloadavg())
    if not report["evaluation"]:
        report.pop("evaluation")
    else:
        report["evaluation_speed_ratio"] = ("whole migration's time / --shard-eval migration's time, per interleaved pair "
                                            "(above 1: sharded evaluation is faster); eval_s: the passes' wall time, "
                                            "each its slower rank's")
    if report["shapes"]:
        _table(report)
    else:
        report.pop("shapes")
        report.pop("speed_ratio")
    for name, r in report.get("evaluation", {}).items():
        cells = [f"{r['speed_ratio_whole_over_sharded'][w]['median']:.3f} [{r['speed_ratio_whole_over_sharded'][w]['ci95'][0]:.3f}, "
                 f"{r['speed_ratio_whole_over_sharded'][w]['ci95'][1]:.3f}]" for w in ("eval_s", "wall_s")]
        samples = "/".join(f"{v:g}" for v in r["eval_samples_per_rank_per_pass"]["sharded"].values())
        whole = "/".join(f"{v:g}" for v in r["eval_samples_per_rank_per_pass"]["whole"].values())
        print(f"{'shape':14} {'eval samples/rank/pass (whole -> sharded)':>42} {'speed (evaluation)':>22} {'speed (whole run)':>22}")
        print(f"{name:14} {whole + ' -> ' + samples:>42} {cells[0]:>22} {cells[1]:>22}  metrics equal: "
              f"{r['checks']['metrics_equal']}  {'PASS' if r['pass'] else 'FAIL ' + ','.join(k for k, v in r['checks'].items() if not v)}")
    if args.json_path:
        Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_path).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r["pass"] for part in ("shapes", "evaluation") for r in report.get(part, {}).values()) else 1


def _table(report: dict) -> None:
    print(f"{'shape':14} {'samples/rank/epoch':>20} {'N/world':>8} {'allreduce/step':>15} {'speed (train)':>22} "
          f"{'speed (train CPU)':>22} {'speed (whole run)':>22}")
    for name, r in report["shapes"].items():
        mig = r["counts"]["migrated"]
        samples = "/".join(f"{v:g}" for v in mig["samples_per_rank_per_epoch"].values())
        per_step = "/".join(f"{v:g}" if v is not None else "-" for v in mig["allreduces_per_step"].values())
        cells = []
        for what in ("train_s", "train_cpu_s", "wall_s"):
            s = r["speed_ratio_hand_over_migrated"][what]
            cells.append(f"{s['median']:.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}]")
        print(f"{name:14} {samples:>20} {r['expected_samples_per_rank_per_epoch']:>8g} {per_step:>15} {cells[0]:>22} "
              f"{cells[1]:>22} {cells[2]:>22}"
              f"  {'PASS' if r['pass'] else 'FAIL ' + ','.join(k for k, v in r['checks'].items() if not v)}")


if __name__ == "__main__":
    sys.exit(main())
