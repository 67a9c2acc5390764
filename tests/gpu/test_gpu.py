"""The generated CUDA/NCCL code and `dp2ddp verify` on a real GPU.

One GPU: two NCCL ranks cannot share a device, so every DDP run here is one process
(``torchrun --nproc_per_node=1``, NCCL) and plain ``python`` (a world of one, also NCCL); what
two ranks do is covered on CPU (gloo) by the rest of the suite. Every launch is the real
command (no zygote: a fork would share the parent's CUDA state). Each process writes what it
did with CUDA and the process group (tests/gpu/audit), and the test asserts on that, not on
the exit code alone.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._scripts import copy_to, run_script
from tests.gpu.conftest import ON_CPU
from tests.test_rewrite_fixtures import RUNNABLE, _id, _with_project_modules

ROOT = Path(__file__).resolve().parents[2]
AUDIT = Path(__file__).resolve().parent / "audit"
BACKEND = "gloo" if ON_CPU else "nccl"
DEVICE = "cpu" if ON_CPU else "cuda:0"
REPORT = os.environ.get("DP2DDP_GPU_REPORT")  # a JSON-lines file: one line per launch (the session's record)


def _env(audit: Path) -> dict:
    from tests._scripts import _env as base

    env = base()
    env["PYTHONPATH"] = os.pathsep.join([str(AUDIT), str(ROOT), env.get("PYTHONPATH", "")])
    env["DP2DDP_GPU_AUDIT"] = str(audit)
    if ON_CPU:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _records(audit: Path) -> list:
    return [json.loads(p.read_text()) for p in sorted(audit.glob("*.json"))]


def _note(what: str, how: str, r: subprocess.CompletedProcess, recs: list) -> None:
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps({"case": what, "launch": how, "exit": r.returncode, "records": recs,
                                "tail": (r.stdout or "")[-1500:] if r.returncode else ""}) + "\n")


def _launch(script: Path, how: str, what: str, *args: str) -> list:
    """Run ``script`` (``torchrun`` with one process, or ``python``) for real; returns the
    audit records of its processes, after asserting that it exited 0 and that whatever
    process group and DDP wrap it made are on the GPU (NCCL, parameters on ``cuda:0``)."""
    audit = script.parent / f"audit-{how}"
    audit.mkdir()
    nproc = 1 if how == "torchrun" else None
    r = run_script([str(script), *args], script.parent, env=_env(audit), nproc=nproc, timeout=300, real=True)
    recs = _records(audit)
    _note(what, how, r, recs)
    assert r.returncode == 0, r.stdout[-4000:]
    for rec in recs:
        for init in rec["init"]:  # (device_id: the migration's set-up passes it; a mixed script's own init may not)
            assert init["backend"] == BACKEND, (how, rec)
        for wrap in rec["ddp"]:
            assert wrap["devices"] == [DEVICE], (how, rec)
            if not ON_CPU:
                assert wrap["device_ids"] in (["0"], ["cuda:0"]), (how, rec)
        if not ON_CPU and (rec["init"] or rec["ddp"]):
            assert rec.get("cuda_initialized"), (how, rec)
    return recs


VERIFIED = [
    ("examples/train_cifar_dp.py", ["--epochs", "2"]),
    ("fixtures/verify/mlp.py", []),
    ("fixtures/verify/bn_gpu_only.py", []),
    ("fixtures/verify/bn.py", []),
    ("fixtures/verify/evaluate.py", []),
]


@pytest.mark.parametrize("src,args", VERIFIED, ids=[Path(s).stem for s, _ in VERIFIED])
def test_verify_dataparallel_against_ddp_on_one_gpu(src: str, args: list, tmp_path: Path) -> None:
    """`dp2ddp verify`: DataParallel on one GPU (python) against its migration (torchrun, one
    NCCL process): losses agree, replicas (hashed from GPU tensors) in sync, every sample once,
    and the peak GPU memory of both runs in the report."""
    work = tmp_path / "v"
    work.mkdir()
    shutil.copyfile(ROOT / src, work / "train.py")
    for extra in (ROOT / src).parent.glob("*_helpers.py"):
        shutil.copyfile(extra, work / extra.name)
    out = tmp_path / "verify.json"
    cmd = [sys.executable, "-m", "dp2ddp", "verify", str(work / "train.py"), "--nproc", "1", "--steps", "30",
           "--repeat", "2", "--min-speedup", "0", "--json", str(out), "--plot", str(tmp_path / "verify.png"),
           "--", *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    if ON_CPU:
        env["CUDA_VISIBLE_DEVICES"] = ""
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=env, timeout=480)
    rep = json.loads(out.read_text()) if out.exists() else {}
    if REPORT:
        with open(REPORT, "a") as f:
            keep = {k: rep.get(k) for k in ("verdict", "losses_agree", "max_rel_loss_diff", "steps_compared",
                                           "replicas_in_sync", "speed", "original", "migrated", "problems",
                                           "notes", "data", "tolerance")}
            f.write(json.dumps({"case": src, "launch": "verify", "exit": r.returncode, "report": keep,
                                "stdout": r.stdout[-3000:], "stderr": r.stderr[-2000:]}) + "\n")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert rep["verdict"] == "pass" and rep["losses_agree"] and rep["replicas_in_sync"], rep["problems"]
    assert rep["steps_compared"] > 0
    if not ON_CPU:
        for side in ("original", "migrated"):
            gpu = rep[side]["gpu_memory"]
            assert gpu["device"].startswith("NVIDIA") and gpu["max_mib"] > 0, rep[side]
        assert "peak GPU memory" in r.stdout


def _expected(case: Path) -> Path:
    return case.with_name(case.name.replace(".in.py", ".out.py"))


def _original_on_this_machine(case: Path, tmp_path: Path) -> list:
    """The fixture's DataParallel original, run with ``python`` here first: a script that never
    puts its model on the GPU cannot run DataParallel on a CUDA machine (its parameters must be
    on ``cuda:0``), and then its migration has nothing to be compared with (skipped, said)."""
    script = _with_project_modules(copy_to(case, tmp_path / "original"), case)
    audit = script.parent / "audit"
    audit.mkdir()
    r = run_script([str(script)], script.parent, env=_env(audit), timeout=300, real=True)
    recs = _records(audit)
    _note(_id(case), "original", r, recs)
    if r.returncode != 0:
        last = (r.stdout or "").strip().splitlines()[-1:] or ["(no output)"]
        pytest.skip(f"the DataParallel original does not run on this machine either: {last[0][:200]}")
    return recs


@pytest.mark.parametrize("case", RUNNABLE, ids=_id)
def test_migrated_fixture_runs_on_the_gpu(case: Path, tmp_path: Path) -> None:
    """Every fixture output that trains: ``torchrun --nproc_per_node=1`` (NCCL) and ``python``
    on the GPU; whatever DDP wraps lives on the rank's device. The original runs first (see
    :func:`_original_on_this_machine`)."""
    original = _original_on_this_machine(case, tmp_path)
    if not ON_CPU and not any(rec.get("cuda_initialized") for rec in original):
        pytest.skip("the DataParallel original trains on the CPU here (it never placed its model, and its "
                    "DataParallel, under a device-count test or functional, never ran): docs/known-issues.md")
    on_gpu = any(d.startswith("cuda") for rec in original for dp in rec["dp"] for d in dp["devices"])
    recs = []
    for how in ("torchrun", "python"):
        script = _with_project_modules(copy_to(_expected(case), tmp_path / how), case)
        recs += _launch(script, how, _id(case))
    assert any(rec["init"] for rec in recs), "no process group was initialised"
    if not ON_CPU and on_gpu:
        assert all(wrap["devices"] == [DEVICE] for rec in recs for wrap in rec["ddp"]), recs


def _rewrite(src: Path, work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, work / "train.py")
    r = subprocess.run([sys.executable, "-m", "dp2ddp", "rewrite", str(work / "train.py")], capture_output=True,
                       text=True, cwd=ROOT)
    assert r.returncode == 0 and (work / "train_ddp.py").exists(), r.stdout + r.stderr
    return work / "train_ddp.py"


def test_bundled_example_trains_on_the_gpu(tmp_path: Path) -> None:
    """`make demo`'s example, rewritten now, under torchrun (one NCCL process) and python; its
    DataParallel wrap runs only on CUDA, so only here does the original wrap at all."""
    migrated = _rewrite(ROOT / "examples" / "train_cifar_dp.py", tmp_path / "example")
    for how in ("torchrun", "python"):
        recs = _launch(migrated, how, "examples/train_cifar_dp", "--epochs", "1")
        assert sum(len(rec["ddp"]) for rec in recs) == 1, recs
