"""The migrated run does the work of a careful hand migration (issue 20), proven by running it.

For each shape of ``fixtures/work/`` (a DataParallel script and its hand migration to DDP):
the script is migrated; the original runs as plain ``python``, the migration and the hand
migration under ``torchrun --nproc_per_node=2`` (gloo); ``tests/work_probe`` counts from
outside each process the optimizer steps, the gradient all-reduces, the samples its
training forwards received, and keeps its final parameters. Asserted, per shape:

* each rank of the migration processes N / world samples per epoch, as the hand migration
  does (the original processes N);
* the migration all-reduces the gradients once per optimizer step (accumulation: not once
  per backward pass), as the hand migration does;
* the migration's replicas are identical, and its parameters equal the hand migration's and
  the original's (the same global batches, summed in another order: allclose).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Dict, List

import pytest

from dp2ddp.migrate import migrate_source
from tests._scripts import retry_exit_abort, run_script

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "fixtures" / "work"
PROBE = Path(__file__).resolve().parent / "work_probe"

pytestmark = pytest.mark.torchrun

sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_work import SHAPES  # noqa: E402  (one entry per shape: the benchmark's and this test's)

BY_NAME = {s.name: s for s in SHAPES}


def _env(out: Path, dim: int) -> dict:
    env = dict(os.environ)
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env["PYTHONPATH"] = str(PROBE)
    env["DP2DDP_WORK_OUT"] = str(out)
    env["DP2DDP_WORK_DIM"] = str(dim)
    env["OMP_NUM_THREADS"] = "1"
    return env  # the probe gives gloo time at exit, as the exit-race guard would


def _facts(out: Path) -> Dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}


def _params(out: Path, rank: str) -> List:
    import torch

    return torch.load(out / f"{rank}.pt", weights_only=True)


def _close(a: List, b: List) -> bool:
    import torch

    return len(a) == len(b) and all(torch.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(a, b))


@pytest.mark.parametrize("shape", sorted(BY_NAME))
def test_migration_does_the_work_of_a_hand_migration(shape: str, tmp_path: Path) -> None:
    spec = BY_NAME[shape]
    args, n, epochs, dim = spec.test_args, spec.test_samples, spec.epochs, spec.dim
    result = migrate_source((WORK / f"{shape}.py").read_bytes(), f"{shape}.py")
    assert not result.migration.blocked and result.changed
    assert not result.migration.warnings, [f"{f.line}: {f.code} {f.message}" for f in result.migration.warnings]
    work = tmp_path / "scripts"
    work.mkdir()
    shutil.copy(WORK / f"{shape}.py", work / f"{shape}.py")
    shutil.copy(WORK / f"{shape}_hand.py", work / f"{shape}_hand.py")
    (work / f"{shape}_ddp.py").write_bytes(result.output)
    outs = {tag: tmp_path / tag for tag in ("original", "migrated", "hand")}

    r = run_script([f"{shape}.py", *args], work, env=_env(outs["original"], dim))
    assert r.returncode == 0, r.stdout[-3000:]
    for tag, script in (("migrated", f"{shape}_ddp.py"), ("hand", f"{shape}_hand.py")):
        r = retry_exit_abort(lambda: run_script([script, *args], work, env=_env(outs[tag], dim), nproc=2), f"{shape} {tag}")
        assert r.returncode == 0, r.stdout[-3000:]

    original = _facts(outs["original"])["rank-"]
    assert original["samples"] == n * epochs
    for tag in ("migrated", "hand"):
        facts = _facts(outs[tag])
        assert sorted(facts) == ["rank0", "rank1"], (tag, facts)
        for rank, f in facts.items():
            assert f["steps"] == original["steps"], (tag, rank, f)  # the original's number of steps
            assert n * epochs // 2 <= f["samples"] <= (n // 2 + spec.padding) * epochs, (tag, rank, f)  # N / world per epoch
            if spec.allreduces_per_step is not None:
                assert f["reductions"] == spec.allreduces_per_step * f["steps"], (tag, rank, f)
        assert facts["rank0"]["params"] == facts["rank1"]["params"], f"{tag}: replicas differ"
    migrated = _params(outs["migrated"], "rank0")
    assert _close(migrated, _params(outs["hand"], "rank0")), "the migration trained another model than the hand migration"
    assert _close(migrated, _params(outs["original"], "rank-")), "the migration trained another model than the original"
