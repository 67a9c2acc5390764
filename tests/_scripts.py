"""Running scripts for real in tests: plain python and torchrun, always reaped."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

# torch 2.13 (CPU, gloo): a rank sometimes aborts while its process exits, after all its work
# is done (see the closing note of the rewrite issue). Tests retry only on these messages.
TEARDOWN_ABORT = ("terminate called without an active exception", "Fatal Python error: Aborted")


def aborted_at_exit(output: str) -> bool:
    return any(sign in output for sign in TEARDOWN_ABORT)


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    env.pop("WORLD_SIZE", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run(cmd, cwd, timeout=180) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {cmd}\n{out.decode(errors='replace')[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out.decode(errors="replace"), "")


def run_python(script: Path, workdir: Path, *args: str) -> subprocess.CompletedProcess:
    return run([sys.executable, str(script), *args], workdir)


def run_torchrun(script: Path, workdir: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    return run([*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", str(script), *args], workdir)


def copy_to(script: Path, workdir: Path, name: str = "train.py") -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    dest = workdir / name
    shutil.copyfile(script, dest)
    return dest
