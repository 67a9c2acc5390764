"""Helpers for the `dp2ddp verify` tests: run the real command in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests import _zygote
from tests._scripts import retry_exit_abort

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures" / "verify"


def marker_env() -> tuple:
    """An environment with a unique marker every descendant of verify inherits."""
    value = uuid.uuid4().hex
    env = dict(os.environ, DP2DDP_TEST_MARKER=value, NO_COLOR="1")
    return env, value


def survivors(value: str) -> list:
    """Live (non-zombie) processes carrying the marker."""
    out = []
    needle = f"DP2DDP_TEST_MARKER={value}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def _keep_scratch_in(tmp_path: Path, output: str) -> None:
    """A verify that did not pass keeps its scratch folder for the user (``logs and records
    kept in /tmp/dp2ddp-verify-...``); a test's is moved into the test's own tmp_path, which
    pytest prunes, instead of piling up in /tmp (155 of them after a few sessions)."""
    import re
    import shutil

    for found in re.findall(r"logs and records kept in (\S+)", output):
        scratch = Path(found)
        if scratch.name.startswith("dp2ddp-verify-") and scratch.is_dir() and not str(scratch).startswith(str(tmp_path)):
            shutil.move(str(scratch), str(tmp_path / scratch.name))


def verify(tmp_path: Path, *args: str, timeout: float = 400, cwd: Path = None, real: bool = False) -> tuple:
    """Run `dp2ddp verify ARGS --json ...` (from ``cwd``, default ``tmp_path``; the report goes
    to ``tmp_path``); return (exit code, report or None, stdout+stderr, seconds).

    One pair of runs (`--repeat 1`) unless ARGS choose: most tests check the comparison,
    not the speed, and the default's three or four pairs would triple their time.

    verify and its runs fork from a zygote (tests/_zygote.py ``run_verify``,
    tests/_verify_launch.py) unless ``real``: the tests about how verify launches, watches and
    ends processes (hangs, stacks, Ctrl-C, torchrun's agent) pass ``real=True``."""
    report = tmp_path / f"report-{uuid.uuid4().hex[:6]}.json"
    env, value = marker_env()
    if not real:
        env = _zygote.verify_env(env)
    mine = list(args[: args.index("--")] if "--" in args else args)
    repeat = [] if any(a == "--repeat" or a.startswith("--repeat=") for a in mine) else ["--repeat", "1"]
    cmd = [sys.executable, "-m", "dp2ddp", "verify", "--json", str(report), *repeat, *args]
    took = 0.0

    def attempt() -> subprocess.CompletedProcess:
        nonlocal took
        t0 = time.monotonic()
        if real:
            p = subprocess.run(cmd, cwd=str(cwd or tmp_path), env=env, capture_output=True, text=True, timeout=timeout)
        else:  # verify itself forked from the verify zygote too, where its environment allows
            p = _zygote.run_verify(cmd[4:], cwd or tmp_path, env, timeout)
        took = time.monotonic() - t0
        _keep_scratch_in(tmp_path, p.stdout + p.stderr)
        assert survivors(value) == [], "processes started by verify survived it"
        assert _zygote.forks_alive() == [], "runs of verify (forks of the verify zygote) survived it"
        _zygote.verify_fallbacks()
        return subprocess.CompletedProcess(cmd, p.returncode, p.stdout + p.stderr, "")

    # torch 2.13/gloo exit race (see tests/_scripts.py): retried loudly, only on its message
    p = retry_exit_abort(attempt, f"verify {' '.join(args)}")
    data = json.loads(report.read_text()) if report.exists() else None
    return p.returncode, data, p.stdout, took


def fixture(name: str) -> str:
    return str(FIXTURES / name)


PROBE_DIR = Path(__file__).resolve().parents[1] / "dp2ddp" / "verify" / "probe"


def run_probe(tmp_path: Path, source: str, name: str = "train.py", **env_extra: str):
    """``source`` written to ``tmp_path/name`` and run in a fresh Python with verify's probe
    as the original run (records into ``tmp_path``): ``(completed process, records of rank 0)``
    (the records are empty where the run wrote none)."""
    script = tmp_path / name
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DP2DDP_VERIFY")}
    env.update(PYTHONPATH=str(PROBE_DIR), DP2DDP_VERIFY_ROLE="original", DP2DDP_VERIFY_OUT=str(tmp_path), **env_extra)
    p = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                       timeout=120)
    out = tmp_path / "original-rank0.jsonl"
    recs = [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else []
    return p, recs
