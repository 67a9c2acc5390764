"""Overhead of the `dp2ddp verify` probe per training step (target: <= 2 %).

Runs the same small training script alternately without and with the probe, in this one
run, and compares the median time per optimizer step that the script measures itself.

    python benchmarks/bench_probe.py [--reps 5] [--steps 400]
    python benchmarks/bench_probe.py --speedup   # also: verify's speed-up on both speed fixtures

Exit status 0 when the overhead is within the target, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "dp2ddp" / "verify" / "probe"
TARGET = 0.02

SCRIPT = r'''
import sys, time
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.set_num_threads(1)
torch.manual_seed(0)
steps = int(sys.argv[1])
x = torch.randn(64 * 50, 128)
y = x @ torch.randn(128, 1)
loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
model = nn.DataParallel(nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
done, t0 = 0, None
while done < steps:
    for xb, yb in loader:
        if done == 20:
            t0 = time.perf_counter()  # after warm-up
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        done += 1
        if done >= steps:
            break
print("PER_STEP", (time.perf_counter() - t0) / (steps - 20))
'''


def one(script: Path, steps: int, probe: bool, out: Path) -> float:
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("DP2DDP_VERIFY"):
            del env[k]
    if probe:
        env["PYTHONPATH"] = str(PROBE) + os.pathsep + env.get("PYTHONPATH", "")
        env.update(DP2DDP_VERIFY_ROLE="original", DP2DDP_VERIFY_OUT=str(out), DP2DDP_VERIFY_STEPS="0", DP2DDP_VERIFY_TAG="bench")
    p = subprocess.run([sys.executable, str(script), str(steps)], env=env, capture_output=True, text=True, check=True)
    line = next(x for x in p.stdout.splitlines() if x.startswith("PER_STEP"))
    if probe:
        recs = [json.loads(x) for x in (out / "original-rank0.jsonl").read_text().splitlines()]
        assert sum(r["ev"] == "step" for r in recs) >= steps, "the probe did not record every step"
        (out / "original-rank0.jsonl").unlink()
    return float(line.split()[1])


def speedups() -> None:
    for name, args in (("tiny.py", ["--steps", "40"]), ("slow_data.py", ["--steps", "14", "--warmup", "2"])):
        with tempfile.TemporaryDirectory() as d:
            rep = Path(d) / "r.json"
            subprocess.run(
                [sys.executable, "-m", "dp2ddp", "verify", "--json", str(rep), "--min-speedup", "0", *args, str(ROOT / "fixtures" / "verify" / name)],
                capture_output=True,
            )
            r = json.loads(rep.read_text())
            print(
                f"verify {name:13s}: speed-up {r['speedup']:.2f} "
                f"(original {r['original']['samples_per_s']:.0f} samples/s, migrated {r['migrated']['samples_per_s']:.0f}); "
                f"losses agree {r['losses_agree']}, replicas in sync {r['replicas_in_sync']}"
            )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--speedup", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        script = Path(d) / "train.py"
        script.write_text(SCRIPT)
        base, probed = [], []
        for _ in range(a.reps):  # alternate, so drifts in machine load hit both alike
            base.append(one(script, a.steps, False, Path(d)))
            probed.append(one(script, a.steps, True, Path(d)))
    b, p = statistics.median(base), statistics.median(probed)
    overhead = p / b - 1
    print(f"per step without probe: {b * 1e3:.3f} ms (median of {a.reps})")
    print(f"per step with probe:    {p * 1e3:.3f} ms (median of {a.reps})")
    print(f"probe overhead: {overhead * 100:+.2f} % per step (target <= {TARGET * 100:.0f} %): {'OK' if overhead <= TARGET else 'OVER'}")
    if a.speedup:
        speedups()
    return 0 if overhead <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
