"""Project mode: ``dp2ddp rewrite train.py --with-helpers`` migrates the script that runs and
the project modules that hold its DataParallel wraps as one plan."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dp2ddp.cli import main
from tests._scripts import retry_exit_abort, run_script

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "fixtures" / "project" / "factory_in_models"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    d = tmp_path / "proj"
    shutil.copytree(PROJECT, d)
    return d


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def test_script_without_dataparallel_whose_helper_wraps_is_refused_not_silent(project: Path, capsys) -> None:
    before = {p: p.read_bytes() for p in project.rglob("*.py")}
    assert main(["rewrite", str(project / "train.py")]) == 1
    err = capsys.readouterr().err
    assert "DDP151" in err and "models/__init__.py:18" in err and "--with-helpers" in err
    assert {p: p.read_bytes() for p in project.rglob("*.py")} == before  # nothing written, nothing changed


def test_with_helpers_needs_an_output_mode(project: Path, capsys) -> None:
    assert main(["rewrite", "--with-helpers", str(project / "train.py")]) == 2
    assert "--in-place, --diff, or -o DIR" in capsys.readouterr().err


@pytest.mark.torchrun
def test_project_copy_migrated_runs_and_its_evaluation_script_still_loads(project: Path, tmp_path: Path) -> None:
    """-o DIR: a copy of the project with the entry and its helper migrated; it trains under
    torchrun (2 ranks) and plain python, the evaluation script (no process group) builds the
    model with the migrated factory and loads the checkpoint, and a second rewrite of the
    copy changes nothing."""
    out = tmp_path / "proj_ddp"
    assert main(["rewrite", "--with-helpers", "-o", str(out), str(project / "train.py")]) == 0
    assert (out / "evaluate.py").read_bytes() == (project / "evaluate.py").read_bytes()
    helper = (out / "models" / "__init__.py").read_text()
    assert "DataParallel(" not in helper.replace("DistributedDataParallel(", "") and "dist.is_initialized()" in helper
    r = retry_exit_abort(lambda: run_script(["train.py"], out, env=_env(), nproc=2), "project")
    assert r.returncode == 0, r.stdout[-3000:]
    assert r.stdout.count("outputs 1") == 1  # printed by rank 0 only
    ev = subprocess.run([sys.executable, "evaluate.py"], cwd=out, env=_env(), capture_output=True, text=True, timeout=120)
    assert ev.returncode == 0 and ev.stdout.startswith("eval Net"), ev.stderr[-2000:]
    r = run_script(["train.py"], out, env=_env())
    assert r.returncode == 0, r.stdout[-3000:]
    again = tmp_path / "again"
    assert main(["rewrite", "--with-helpers", "-o", str(again), str(out / "train.py")]) == 0
    for rel in ("train.py", "models/__init__.py"):
        assert (again / rel).read_bytes() == (out / rel).read_bytes(), rel
