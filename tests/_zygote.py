"""Test harness only: launch scripts from pre-imported Pythons (tests/_zygote_server.py).

Each pytest process starts, on first use, two servers ("zygotes") that have imported
torch; a launch forks a child of one of them instead of starting an interpreter (and,
for torchrun, a launcher) that imports torch again. Rank ``r`` of a world is forked from
zygote ``r % 2`` (each zygote has its own string-hash seed, so the two ranks' set and
dict-of-str orders differ as they do between two real processes); a plain run from zygote 0.

:func:`launch` returns ``None`` where a fork would not be faithful, and the caller runs the
real command: an environment variable read at import time (``OMP_*``, ``MKL_*``,
``TORCH_*``, ``PYTHON*``, ...) that differs from the zygote's, or a module of the script's
folder or ``PYTHONPATH`` whose name a zygote already imported (the fork would get the
zygote's copy). ``DP2DDP_TEST_REAL_LAUNCH=1`` turns the zygotes off altogether.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence

SERVER = Path(__file__).resolve().parent / "_zygote_server.py"
# read when torch, numpy or the interpreter start: a zygote's value is already baked in
IMPORT_TIME = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA_", "LD_", "MALLOC_", "PYTHON")
NOT_IMPORT_TIME = {"PYTHONPATH", "PYTHONUNBUFFERED", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
NOT_IMPORT_TIME_PREFIX = ("TORCHELASTIC_",)
# python -I ignores PYTHON*; the one isolated script launched (verify's checkpoint loader:
# unpickling, no arithmetic) does not depend on the size of the thread pools
ISOLATED_IGNORES = ("PYTHON", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# what torchrun itself (not its workers) adds to every worker's environment (the list of
# torch/distributed/elastic/agent/server/local_elastic_agent.py, 2.13); with no agent store
# (TORCHELASTIC_USE_AGENT_STORE unset) rank 0 hosts the TCPStore at MASTER_ADDR:MASTER_PORT
MASTER_ADDR = "localhost"  # what torchrun --standalone gives (tests/test_zygote.py compares)

FALLBACKS: List[str] = []  # why a launch ran the real command (for the curious: -s prints nothing)


def enabled() -> bool:
    return os.environ.get("DP2DDP_TEST_REAL_LAUNCH", "") not in ("1", "true", "yes")


def base_env() -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


class Zygote:
    def __init__(self, extra_env: Optional[Dict[str, str]] = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="dp2ddp-zygote-")
        self.path = os.path.join(self.dir, "sock")
        self.env = dict(base_env(), **(extra_env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER), self.path], cwd=self.dir, env=self.env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=open(os.path.join(self.dir, "server.log"), "wb"), start_new_session=True,
        )
        line = self.proc.stdout.readline()
        try:
            hello = json.loads(line)
        except ValueError:
            hello = {"error": f"no answer: {line!r}; {Path(self.dir, 'server.log').read_text()[-2000:]}"}
        if "ready" not in hello:
            self.close()
            raise RuntimeError(f"zygote did not start: {hello.get('error')}")
        self.modules = set(hello["modules"])
        self.pid = self.proc.pid
        self.descriptor = os.path.join(self.dir, "zygote.json")  # what a launcher in another process needs
        with open(self.descriptor, "w") as fh:
            json.dump({"path": self.path, "env": self.env, "modules": sorted(self.modules), "pid": self.pid,
                       "executable": sys.executable}, fh)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, argv: Sequence[str], cwd: str, env: Dict[str, str], out_fd: int, isolated: bool = False,
              err_fd: Optional[int] = None) -> "Child":
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        body = json.dumps({"argv": list(argv), "cwd": str(cwd), "env": env, "isolated": isolated}).encode()
        socket.send_fds(conn, [struct.pack("!I", len(body)) + body], [out_fd] if err_fd is None else [out_fd, err_fd])
        return Child(conn)

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()  # the server kills its children and exits
            self.proc.wait(timeout=10)
        except Exception:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)  # the socket and the server's log


class Remote:
    """A zygote another process started (its descriptor file): runs can be started on it."""

    start = Zygote.start

    def __init__(self, descriptor: str) -> None:
        with open(descriptor) as fh:
            d = json.load(fh)
        self.path, self.env, self.modules, self.pid = d["path"], d["env"], set(d["modules"]), d["pid"]
        self.executable = d["executable"]


class Child:
    """A forked run: its pid (= its process group) and, once reaped, its exit code."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn = conn
        self.buf = b""
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        msg = self._read(timeout=60)
        if msg is None or "pid" not in msg:
            raise RuntimeError(f"zygote refused the run: {msg}")
        self.pid = msg["pid"]

    def _read(self, timeout: float):
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.conn], [], [], left)[0]:
                return None
            more = self.conn.recv(4096)
            if not more:
                return {"error": "connection closed"}
            self.buf += more
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> Optional[int]:
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            msg = self._read(timeout=1)
            if msg is not None:
                self.returncode = msg.get("exit", -signal.SIGKILL)
                self.conn.close()
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None and self.pid:
            for kill in (os.killpg, os.kill):
                try:
                    kill(self.pid, signal.SIGKILL)
                except OSError:
                    pass

    def wait(self, timeout: float) -> Optional[int]:
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            select.select([self.conn], [], [], max(0.0, min(0.5, deadline - time.monotonic())))
        return self.returncode


_ZYGOTES: Dict[int, Zygote] = {}
_LOCK = threading.Lock()


def zygote(i: int) -> Zygote:
    with _LOCK:
        if not all(i in _ZYGOTES and _ZYGOTES[i].alive() for i in range(2)):
            # both at once: their imports overlap (the first launch of a world needs both)
            started = {}
            threads = [threading.Thread(target=lambda k=k: started.__setitem__(k, Zygote())) for k in range(2)
                       if not (k in _ZYGOTES and _ZYGOTES[k].alive())]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if len(started) != len(threads):
                for z in started.values():
                    z.close()
                raise RuntimeError("a zygote did not start (see the error above)")
            _ZYGOTES.update(started)
        return _ZYGOTES[i]


@atexit.register
def shutdown() -> None:
    with _LOCK:
        for z in _ZYGOTES.values():
            z.close()
        _ZYGOTES.clear()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _why_not(argv: Sequence[str], cwd: str, env: Dict[str, str], z=None, isolated: bool = False) -> Optional[str]:
    """Why a fork of ``z`` would not do what ``python ARGV`` (``python -I ARGV`` when
    ``isolated``: PYTHON* variables ignored, nothing but the interpreter's own ``sys.path``)
    would; None when it would."""
    z = z or zygote(0)
    for key in set(env) | set(z.env):
        if isolated and key.startswith(ISOLATED_IGNORES):
            continue
        if (key.startswith(IMPORT_TIME) and key not in NOT_IMPORT_TIME and not key.startswith(NOT_IMPORT_TIME_PREFIX)
                and env.get(key) != z.env.get(key)):
            return f"{key}={env.get(key)!r} (the zygote has {z.env.get(key)!r})"
    if isolated:
        return None
    script = Path(cwd, argv[0])
    folders = [script.resolve().parent] + [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for folder in folders:
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for p in entries:
            if p.suffix in (".py", ".so") and p.is_file():
                name = p.name.split(".")[0]
            elif p.is_dir() and (p / "__init__.py").exists():
                name = p.name
            else:
                continue
            if name in z.modules and name != "sitecustomize":
                return f"{p} shadows the zygote's module {name!r}"
    return None


def worker_envs(env: Dict[str, str], nproc: int, errdir: str) -> List[Dict[str, str]]:
    """The environment of each worker of ``torchrun --standalone --nproc_per_node=NPROC``
    started with ``env`` (its error files in ``errdir``)."""
    port = _free_port()
    run_id = str(uuid.uuid4())
    return [
        dict(
            env, RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank), ROLE_NAME="default",
            LOCAL_WORLD_SIZE=str(nproc), WORLD_SIZE=str(nproc), GROUP_WORLD_SIZE="1", ROLE_WORLD_SIZE=str(nproc),
            MASTER_ADDR=MASTER_ADDR, MASTER_PORT=str(port), TORCHELASTIC_RESTART_COUNT="0",
            TORCHELASTIC_MAX_RESTARTS="0", TORCHELASTIC_RUN_ID=run_id,
            TORCH_NCCL_ASYNC_ERROR_HANDLING=env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            TORCHELASTIC_ERROR_FILE=os.path.join(errdir, f"error-{rank}.json"),
        )
        for rank in range(nproc)
    ]


def launch(argv: Sequence[str], cwd, env: Dict[str, str], nproc: Optional[int], timeout: float,
           fail_fast: bool = True, on: Optional["Zygote"] = None) -> Optional[subprocess.CompletedProcess]:
    """``python ARGV`` (``nproc`` None) or ``torchrun --standalone --nproc_per_node=NPROC ARGV``
    as forks of the zygotes, from ``cwd`` with ``env``; stdout and stderr of every process in
    one capture, as torchrun gives them. ``None``: not launched (see the module docstring),
    the caller runs the real command. The result's ``args`` are the command it stands for."""
    if not enabled():
        return None
    cwd = str(cwd)
    env = dict(env)
    if nproc is not None and "OMP_NUM_THREADS" not in env and nproc > 1:
        env["OMP_NUM_THREADS"] = "1"  # what torchrun does
    why = _why_not(argv, cwd, env, on)
    if why is not None:
        FALLBACKS.append(f"{' '.join(argv)}: {why}")
        warnings.warn(f"launched for real, not forked from a zygote: {' '.join(argv)}: {why}")
        return None
    shown = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
             if nproc is not None else [sys.executable]) + list(argv)
    errdir = None
    if nproc is None:
        envs = [env]
    else:
        errdir = tempfile.mkdtemp(prefix="dp2ddp-zygote-run-")
        envs = worker_envs(env, nproc, errdir)
    read_fd, write_fd = os.pipe()
    children: List[Child] = []
    chunks: List[bytes] = []

    def drain() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as fh:
            while True:
                data = fh.read(65536)
                if not data:
                    return
                chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    timed_out = False
    try:
        try:
            zygotes = [on] if on is not None else [zygote(i) for i in range(min(len(envs), 2))]
            for rank, e in enumerate(envs):
                children.append(zygotes[rank % len(zygotes)].start(argv, cwd, e, write_fd))
        finally:
            os.close(write_fd)
        deadline = time.monotonic() + timeout
        while any(c.poll() is None for c in children):
            if time.monotonic() > deadline:
                timed_out = True
                break
            if fail_fast and any(c.returncode not in (None, 0) for c in children):
                break
            select.select([c.conn for c in children if c.returncode is None], [], [], 0.2)
    finally:
        for c in children:  # the process group of each: DataLoader workers and the like too
            if c.pid:
                try:
                    os.killpg(c.pid, signal.SIGKILL)
                except OSError:
                    pass
        for c in children:
            c.kill()
            c.wait(timeout=10)
        reader.join(timeout=10)
        if errdir:
            import shutil

            shutil.rmtree(errdir, ignore_errors=True)
    text = b"".join(chunks).decode(errors="replace")
    if timed_out:
        raise AssertionError(f"timed out after {timeout}s: {' '.join(map(str, shown))}\n{text[-6000:]}")
    codes = [c.returncode for c in children]
    if nproc is None:
        code = codes[0]
    else:
        failed = [(r, c) for r, c in enumerate(codes) if c != 0]
        code = 1 if failed else 0  # torchrun's exit code when a worker failed
        if failed:
            text += "".join(f"\n[zygote launch] rank {r} exited with {c}" for r, c in failed) + "\n"
    return subprocess.CompletedProcess(shown, code, text, "")


# --------------------------------------------------------------------- dp2ddp verify's runs
# `dp2ddp verify` starts its runs itself (python, torchrun); tests/_verify_launch.py, named by
# DP2DDP_VERIFY_LAUNCHER (dp2ddp/verify/runner.py), forks them from a zygote of the pytest
# process instead, with verify's PYTHONHASHSEED and thread counts baked in. Every fork (and
# every fork of a fork) shows the zygote's environment in /proc, MARK_VAR included: what
# tests/verify_helpers.py looks for to see that none outlived verify.
LAUNCHER = Path(__file__).resolve().parent / "_verify_launch.py"
VERIFY_ZYGOTE_VAR = "DP2DDP_TEST_VERIFY_ZYGOTE"
MARK_VAR = "DP2DDP_TEST_ZYGOTE_MARK"
VERIFY_ENV = {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # verify's defaults here
_VERIFY: Dict[str, Zygote] = {}


def verify_zygote() -> Zygote:
    with _LOCK:
        z = _VERIFY.get("z")
        if z is None or not z.alive():
            z = _VERIFY["z"] = Zygote(dict(VERIFY_ENV, **{MARK_VAR: uuid.uuid4().hex}))
        return z


def verify_env(env: Dict[str, str]) -> Dict[str, str]:
    """``env`` for a ``dp2ddp verify`` whose runs fork from the verify zygote (unchanged with
    DP2DDP_TEST_REAL_LAUNCH=1). A run the launcher cannot fork faithfully runs for real.

    With the zygote's PYTHONHASHSEED and thread counts (VERIFY_ENV), so that verify itself
    can fork from it too (:func:`run_verify`): verify gives its runs these values anyway
    (its --seed, and cores // processes threads on two cores), so only its report's word
    for where the thread count came from changes ("OMP_NUM_THREADS from the environment")."""
    if not enabled():
        return dict(env)
    import shlex

    z = verify_zygote()
    # -I -S: none of the run's PYTHONPATH, no sitecustomize (verify's probe would measure the launcher)
    return dict(env, **VERIFY_ENV, DP2DDP_VERIFY_LAUNCHER=f"{shlex.quote(sys.executable)} -I -S {shlex.quote(str(LAUNCHER))}",
                **{VERIFY_ZYGOTE_VAR: z.descriptor})


DP2DDP_MAIN = Path(__file__).resolve().parent / "_dp2ddp_main.py"


def run_verify(args: Sequence[str], cwd, env: Dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m dp2ddp verify ARGS`` from ``cwd`` with ``env``, forked from the verify zygote
    where ``env`` allows it (:func:`verify_env`; pays no interpreter start-up and no ``import
    torch``), else the real command. Its stdout and stderr: ``stdout`` and ``stderr`` of the
    real command; one capture in ``stdout`` (``stderr`` empty) of a fork."""
    cmd = [sys.executable, "-m", "dp2ddp", "verify", *args]
    if enabled() and VERIFY_ZYGOTE_VAR in env:
        done = launch([str(DP2DDP_MAIN), "verify", *args], cwd, env, None, timeout, on=verify_zygote())
        if done is not None:
            return subprocess.CompletedProcess(cmd, done.returncode, done.stdout, "")
    return subprocess.run(cmd, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout)


def verify_fallbacks() -> List[str]:
    """The verify runs the launcher ran for real since the last call (and why), warned about."""
    z = _VERIFY.get("z")
    if z is None:
        return []
    path = os.path.join(z.dir, "fallbacks.log")
    try:
        with open(path) as fh:
            lines = fh.read().splitlines()
        os.unlink(path)
    except OSError:
        return []
    for line in lines:
        FALLBACKS.append(line)
        warnings.warn(f"a run of dp2ddp verify launched for real, not forked from the verify zygote: {line}")
    return lines


def forks_alive() -> List[int]:
    """Live (not zombie) forks of the verify zygote, and their forks: none between verifies."""
    z = _VERIFY.get("z")
    if z is None:
        return []
    needle = f"{MARK_VAR}={z.env[MARK_VAR]}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == z.pid:
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


@atexit.register
def _shutdown_verify() -> None:
    z = _VERIFY.pop("z", None)
    if z is not None:
        z.close()
