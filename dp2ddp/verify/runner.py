"""Launch one run (the original under ``python`` or the migration under ``torchrun``),
watch the probe's per-rank records, detect hangs, and make sure nothing survives."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Set

from dp2ddp.verify import procs

PROBE_DIR = str(Path(__file__).resolve().parent / "probe")
# A command that starts each run in place of python / torchrun: it gets the run's command as
# its arguments and must do what that command does (exit code, signals, every process ended
# with it). For dp2ddp's own test suite (tests/_verify_launch.py); unset, verify runs the
# commands themselves.
LAUNCHER_VAR = "DP2DDP_VERIFY_LAUNCHER"


@dataclass
class RunSpec:
    role: str  # "original" | "migrated"
    script: Path  # the script inside the run's scratch directory
    args: List[str]
    cwd: Path
    out: Path  # where the probe writes its records
    tag: str
    steps: int
    timeout: float
    startup_timeout: float = 60.0  # before every rank has completed a step (imports, data, rendezvous)
    seed: int = 0
    samplers: List[dict] = field(default_factory=list)  # the original's sampler plans (session.sampler_plans)
    nproc: int = 1
    nnodes: int = 1
    env: Dict[str, str] = field(default_factory=dict)
    pythonpath: List[str] = field(default_factory=list)  # after the probe's folder: the project's copy, ...
    extend: int = 0  # run on past --steps, up to this many steps, until the training loader's second epoch
    chunks: int = 0  # the noise-envelope run: DataParallel splits each batch into this many chunks
    redraw: bool = False  # the noise-envelope run: the training step draws from another random stream


@dataclass
class Rank:
    rank: int
    pid: Optional[int] = None
    start: Optional[dict] = None
    steps: List[dict] = field(default_factory=list)
    samplers: List[dict] = field(default_factory=list)
    end: Optional[dict] = None
    error: Optional[dict] = None
    stack: str = ""
    fatal: str = ""
    writes: List[str] = field(default_factory=list)  # absolute paths it opened for writing
    write_sites: Dict[str, list] = field(default_factory=dict)  # path -> [file, line] of the user's code that wrote it
    write_steps: Dict[str, int] = field(default_factory=dict)  # path -> primary step of its last write
    write_appends: Set[str] = field(default_factory=set)  # paths this rank only ever opened to append to
    osteps: List[dict] = field(default_factory=list)  # steps of the other optimizers (a GAN's generator)
    passes: List[dict] = field(default_factory=list)  # every DataLoader pass: the indices it served
    evidence: List[dict] = field(default_factory=list)  # how far the run went for the data evidence


@dataclass
class RunResult:
    role: str
    exit_code: Optional[int]
    wall_s: float
    ranks: Dict[int, Rank]
    logs: List[Path]
    hung: bool = False
    hang_after_s: float = 0.0
    interrupted: bool = False
    command: List[str] = field(default_factory=list)
    root: Optional[Path] = None  # the run's copy of the project (sites are shown relative to it)

    @property
    def steps(self) -> int:
        return min((len(r.steps) for r in self.ranks.values()), default=0)

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for log in self.logs:
            try:
                text = log.read_text(errors="replace").splitlines()
            except OSError:
                continue
            out.extend(text[-lines:])
        return "\n".join(out[-lines:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _commands(spec: RunSpec) -> List[List[str]]:
    script = [str(spec.script), *spec.args]
    if spec.role == "original":
        return [[sys.executable, *script]]
    # ``--`` ends torchrun's options: a script option such as ``--log`` would otherwise be
    # taken for an abbreviation of torchrun's ``--log-dir``/``--logs-specs`` (pytorch/pytorch#120601)
    script = ["--", *script]
    common = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={spec.nproc}",
        "--max-restarts=0",
        f"--log-dir={spec.out / 'torchelastic'}",
    ]
    if spec.nnodes == 1:
        return [[*common, "--standalone", *script]]
    port = free_port()
    cmds = []
    for node in range(spec.nnodes):
        cmds.append(
            [
                *common,
                f"--nnodes={spec.nnodes}",
                "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id=dp2ddp-{spec.tag}",
                f"--rdzv-conf=is_host={'true' if node == 0 else 'false'}",
                "--local-addr=127.0.0.1",
                *script,
            ]
        )
    return cmds


def _env(spec: RunSpec) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(spec.env)
    old = [p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p]
    extra = [p for p in spec.pythonpath if p not in old]
    env["PYTHONPATH"] = os.pathsep.join([PROBE_DIR, *old, *extra])
    env.update(
        {
            procs.TAG_VAR: spec.tag,
            "DP2DDP_VERIFY_ROLE": spec.role,
            "DP2DDP_VERIFY_OUT": str(spec.out),
            "DP2DDP_VERIFY_STEPS": str(spec.steps),
            "DP2DDP_VERIFY_SEED": str(spec.seed),
            "DP2DDP_VERIFY_SAMPLERS": json.dumps(spec.samplers, separators=(",", ":")),
            "DP2DDP_VERIFY_EXTEND": str(spec.extend),
            "DP2DDP_VERIFY_CHUNKS": str(spec.chunks),
            "DP2DDP_VERIFY_REDRAW": "1" if spec.redraw else "",
            "PYTHONHASHSEED": str(spec.seed),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.pop("DP2DDP_VERIFY_ACTIVE", None)
    env.pop(LAUNCHER_VAR, None)  # not for a verify the scripts might start themselves
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        env.pop(var, None)  # a verify started inside a torchrun job must not leak its rank
    return env


class _Reader:
    """Reads the probe's JSONL files incrementally (complete lines only)."""

    def __init__(self, out: Path, role: str) -> None:
        self.out, self.role = out, role
        self.offsets: Dict[Path, int] = {}
        self.ranks: Dict[int, Rank] = {}
        self.last_event = 0.0

    def poll(self) -> bool:
        progressed = False
        for path in sorted(self.out.glob(f"{self.role}-rank*.jsonl")):
            rank = int(path.stem.rsplit("rank", 1)[1])
            off = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(off)
                    data = fh.read()
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self.offsets[path] = off + end + 1
            r = self.ranks.setdefault(rank, Rank(rank))
            for line in data[: end + 1].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                progressed = True
                ev = rec.get("ev")
                if ev == "start":
                    if r.start is not None:  # a restarted worker: start over
                        r.steps, r.samplers, r.end, r.error, r.writes = [], [], None, None, []
                        r.osteps, r.passes, r.evidence = [], [], []
                    r.start, r.pid = rec, rec.get("pid")
                elif ev == "step":
                    r.steps.append(rec)
                elif ev == "sampler":
                    r.samplers.append(rec)
                elif ev == "end":
                    r.end = rec
                elif ev == "error":
                    r.error = rec
                elif ev == "ostep":
                    r.osteps.append(rec)
                elif ev == "pass":
                    r.passes.append(rec)
                elif ev == "evidence":
                    r.evidence.append(rec)
                elif ev == "writes":
                    r.writes = list(rec.get("paths") or [])
                    r.write_sites = dict(rec.get("sites") or {})
                    r.write_steps = dict(rec.get("steps") or {})
                    r.write_appends = set(rec.get("appends") or ())
        if progressed:
            self.last_event = time.monotonic()
        return progressed

    def read_text_files(self) -> None:
        for r in self.ranks.values():
            for attr, suffix in (("stack", "stack"), ("fatal", "fatal")):
                try:
                    setattr(r, attr, (self.out / f"{self.role}-rank{r.rank}.{suffix}").read_text(errors="replace"))
                except OSError:
                    pass


# once one torchrun agent of a multi-node run has failed, how long the others get to end
FAILED_PEER_GRACE_S = 5.0

Progress = Callable[[str, int, Dict[int, Rank]], None]


def run(spec: RunSpec, progress: Optional[Progress] = None) -> RunResult:
    spec.out.mkdir(parents=True, exist_ok=True)
    env = _env(spec)
    cmds = _commands(spec)
    launcher = shlex.split(os.environ.get(LAUNCHER_VAR, ""))
    logs: List[Path] = []
    popen: List[subprocess.Popen] = []
    reader = _Reader(spec.out, spec.role)
    t0 = time.monotonic()
    reader.last_event = t0
    hung = interrupted = False
    failed_at: Optional[float] = None
    last_step = -1
    try:
        for i, cmd in enumerate(cmds):
            log = spec.out / (f"{spec.role}.log" if len(cmds) == 1 else f"{spec.role}-node{i}.log")
            logs.append(log)
            with open(log, "wb") as fh:
                popen.append(
                    subprocess.Popen(
                        [*launcher, *cmd],
                        cwd=str(spec.cwd),
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        while True:
            reader.poll()
            done = all(p.poll() is not None for p in popen)
            steps = min((len(r.steps) for r in reader.ranks.values()), default=0)
            if progress and steps != last_step:
                last_step = steps
                progress(spec.role, steps, reader.ranks)
            if done:
                break
            if failed_at is None and any(p.poll() not in (None, 0) for p in popen):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > FAILED_PEER_GRACE_S:
                break  # an agent failed: its peers would wait minutes in torchrun's exit barrier
            limit = spec.timeout if steps else max(spec.timeout, spec.startup_timeout)
            if limit and time.monotonic() - reader.last_event > limit:
                hung = True
                _dump_stacks(reader)
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        procs.kill_tagged(spec.tag, grace=1.0 if (hung or interrupted) else 3.0, procs=popen)
    reader.poll()
    reader.read_text_files()
    wall = time.monotonic() - t0
    codes = [p.returncode for p in popen]
    code = next((c for c in codes if c), codes[0] if codes else None)
    if hung or interrupted:
        code = None  # ended by verify: its own exit code means nothing
    result = RunResult(
        role=spec.role,
        exit_code=code,
        wall_s=wall,
        ranks=reader.ranks,
        logs=logs,
        hung=hung,
        hang_after_s=time.monotonic() - reader.last_event if hung else 0.0,
        interrupted=interrupted,
        command=cmds[0],
    )
    if interrupted:
        raise Interrupted(result)
    return result


class Interrupted(Exception):
    def __init__(self, result: RunResult) -> None:
        super().__init__("interrupted")
        self.result = result


def _dump_stacks(reader: _Reader) -> None:
    """Ask every rank for its Python stack (faulthandler on SIGUSR1), wait for it briefly."""
    pids = [(r, r.pid) for r in reader.ranks.values() if r.pid]
    procs.signal_pids([pid for _, pid in pids], signal.SIGUSR1)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        reader.read_text_files()
        if all(r.stack.strip() for r, _ in pids):
            time.sleep(0.2)  # let the last lines land
            break
        time.sleep(0.05)
