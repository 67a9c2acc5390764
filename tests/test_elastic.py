"""Elastic restarts: a migrated script launched with `torchrun --max-restarts=1` survives
one killed worker when it checkpoints every epoch and resumes from the checkpoint.

fixtures/elastic/train_elastic.py is a DataParallel script that saves a checkpoint after
every epoch and resumes from it. The test migrates it with the real migration
(``dp2ddp.migrate.migrate_file``), renders the launcher with ``dp2ddp template torchrun
--max-restarts 1`` and runs it: in epoch 2 the worker with RANK 1 SIGKILLs itself (the
fixture's fault-injection hook, armed by FAIL_AT_EPOCH), torchrun restarts the worker
group, and the job must finish with exit 0, resuming at epoch 2 with the same losses as
an uninterrupted run.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from tests._scripts import guarded, retry_exit_abort, run_together

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "elastic" / "train_elastic.py"
EPOCHS = 4
FAIL_AT_EPOCH = 2
TIMEOUT = 150


def _torchrun_shim(folder: Path) -> Path:
    """A `torchrun` on PATH that is this interpreter's torch.distributed.run."""
    folder.mkdir(exist_ok=True)
    shim = folder / "torchrun"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m torch.distributed.run \"$@\"\n")
    shim.chmod(0o755)
    return folder


def _render_launcher(tmp_path: Path, script: Path, ckpt: Path, name: str) -> Path:
    from dp2ddp.cli import main

    launcher = tmp_path / name
    rc = main(["template", "torchrun", str(script), "--gpus-per-node", "2", "--cpu", "--max-restarts", "1",
               "-o", str(launcher), "--", "--epochs", str(EPOCHS), "--ckpt", str(ckpt)])
    assert rc == 0
    return launcher


def _epoch_lines(out: str):
    # the script prints `epoch E loss L` with L to 6 decimals; torchrun's agent and the other
    # rank write to the same pipe, and print() writes its text and its newline in two writes:
    # another process's output can land between them (or before the text, on the same line),
    # so the line is found by its own shape, not by where it starts and ends
    return re.findall(r"epoch (\d+) loss (-?\d+\.\d{6}|nan|-?inf)", out)


@pytest.mark.torchrun
def test_migrated_script_survives_a_killed_worker(tmp_path):
    torch = pytest.importorskip("torch")
    from dp2ddp.migrate import migrate_file

    result = migrate_file(str(FIXTURE))
    assert result.changed and not result.migration.blocked, [f.message for f in result.migration.findings]
    script = tmp_path / "train_elastic_ddp.py"
    script.write_bytes(result.output)

    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "FAIL_AT_EPOCH", "FAIL_MARKER")
           and not k.startswith(("PET_", "TORCHELASTIC_"))}
    env.update(PATH=f"{_torchrun_shim(tmp_path / 'bin')}{os.pathsep}{os.environ.get('PATH', '')}",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env = guarded(env)

    # The launcher is the one users get from `dp2ddp template torchrun --max-restarts 1`.
    ckpt = tmp_path / "ckpt.pth"
    launcher = _render_launcher(tmp_path, script, ckpt, "launch.sh")
    text = launcher.read_text()
    for flag in ("--standalone", "--nproc_per_node=2", "--max_restarts=1"):
        assert flag in text

    # The reference: the same job without a failure, run alongside to save time.
    marker = tmp_path / "worker-killed"
    clean_ckpt = tmp_path / "clean.pth"
    clean_launcher = _render_launcher(tmp_path, script, clean_ckpt, "clean.sh")

    def attempt():
        marker.unlink(missing_ok=True)
        for path in (ckpt, clean_ckpt):
            path.unlink(missing_ok=True)
        return run_together(
            [["bash", str(launcher)], ["bash", str(clean_launcher)]],
            tmp_path,
            [dict(env, FAIL_AT_EPOCH=str(FAIL_AT_EPOCH), FAIL_MARKER=str(marker)), env],
            timeout=TIMEOUT,
            fail_fast=False,
        )

    run, clean = retry_exit_abort(attempt, "elastic restart test")
    out = run.stdout
    assert run.returncode == 0, out[-6000:]
    assert marker.exists(), "the fault-injection hook never fired: no worker was killed"
    # torchrun saw the SIGKILLed worker and restarted the group once.
    assert re.search(r"exitcode: -9\) local_rank: 1", out), out[-6000:]
    assert out.count(f"resumed from {ckpt} at epoch {FAIL_AT_EPOCH}") == 1, out[-6000:]
    assert "training done" in out

    # Epochs 0 and 1 ran before the failure, 2 and 3 after the resume: none ran twice.
    lines = _epoch_lines(out)
    assert [int(e) for e, _ in lines] == list(range(EPOCHS)), out[-6000:]
    state = torch.load(ckpt, map_location="cpu")
    assert state["epoch"] == EPOCHS - 1

    # Resuming is exact: the uninterrupted run reports the same losses for every epoch
    # and ends with the same weights.
    assert clean.returncode == 0, clean.stdout[-6000:]
    assert "resumed" not in clean.stdout and "exitcode" not in clean.stdout
    assert _epoch_lines(clean.stdout) == lines
    clean_state = torch.load(clean_ckpt, map_location="cpu")
    for key, value in clean_state["model"].items():
        assert torch.equal(value, state["model"][key]), key
