"""benchmarks/bench_gpu.py on the CPU (``--quick --device cpu``): the harness the GPU figures
in docs/gpu.md come from runs, measures every arm, and the probe it A/B-tests is really loaded."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_gpu_harness_measures_every_arm_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), "--quick", "--device", "cpu",
                        "--groups", "2", "--block", "2", "--warmup", "1", "--block-s", "0.01",
                        "--workloads", "transformer", "--variants", "view", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stdout + r.stderr  # 1: targets not shown met (a CPU proves nothing of them)
    data = json.loads(out.read_text())
    w = data["workloads"]["transformer-fp32"]
    assert set(w["blocks_s"]) == {"dp", "ddp", "ddp:view", "ddp+probe"}
    assert all(len(v) == 2 and all(t > 0 for t in v) for v in w["blocks_s"].values())
    assert data["env"]["probe"] and data["probe_steps_recorded"] > 0  # the probe was on in its arm
    assert w["ddp_over_dp"]["groups"] == 2 and "ddp:view_over_dp" in w
    assert "transformer-fp32" in r.stdout  # the table
