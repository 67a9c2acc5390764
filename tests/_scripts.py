"""Running scripts for real in tests: plain python and torchrun, always reaped.

Two ways to launch
------------------
* :func:`run` / :func:`run_together`: the real command, a new interpreter per process.
  ``run_script(..., real=True)`` too. What is *about* launching stays on these: the
  elastic and template tests, ``dp2ddp verify`` (which starts ``torchrun`` itself), the
  ``python -c`` probes, the first runnable case of six fixture folders of
  tests/test_rewrite_fixtures.py (``REAL_LAUNCH``) and tests/test_zygote.py (a probe
  script run both ways, what it sees compared): the cross-check of the second way.
* :func:`run_script` (and :func:`run_python`, :func:`run_torchrun`): the same script run
  as a fork of a *zygote* (tests/_zygote.py, tests/_zygote_server.py), a Python that has
  imported torch (with torch.distributed, torch.nn, torch.optim, torch.utils.data,
  torch._dynamo, numpy) once per pytest process. A launch pays no interpreter start-up
  and no ``import torch`` (seconds of CPU each; a torchrun launch paid it three times).

  What the fork does as the real command does: the script runs as ``__main__`` from its
  own file with its ``argv``, ``cwd`` and environment, its folder and ``PYTHONPATH``
  first on ``sys.path``, the ``sitecustomize`` of ``PYTHONPATH`` imported (the exit-race
  guard, the behaviour and work probes), fresh random state (``random``, numpy, torch)
  and per-rank string-hash seeds (rank ``r`` forks from zygote ``r % 2``), unbuffered
  stdout and stderr into one capture, exceptions and ``SystemExit`` turned into the exit
  code as CPython does, threads joined and ``atexit`` handlers run at the end, its own
  process group (killed with everything it started: timeouts and fail-fast as
  :func:`run_together`). For ``nproc=N``: N processes with the environment torchrun's
  agent gives its workers (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
  ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``ROLE_RANK``, ``ROLE_NAME``,
  ``GROUP_WORLD_SIZE``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR=localhost``, ``MASTER_PORT``
  a free port, ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``,
  ``TORCHELASTIC_MAX_RESTARTS``, ``TORCHELASTIC_ERROR_FILE``,
  ``TORCH_NCCL_ASYNC_ERROR_HANDLING``, ``OMP_NUM_THREADS=1`` when unset), exit code 1
  when any rank failed (the others are killed, as torchrun's agent does).

  What it does not cover: torchrun's agent itself (rendezvous, its TCPStore: rank 0 hosts
  the store, ``TORCHELASTIC_USE_AGENT_STORE`` is unset; restarts, its log lines, its exit
  barrier); interpreter start-up (``site``, ``.pth`` files: the zygote's are used) and
  finalization (module teardown, C++ static destructors: ``os._exit`` after ``atexit``
  and a collection of ``__main__``'s globals, so the gloo exit race below cannot happen
  in a forked run); modules the zygote imported are shared, already initialised (a launch
  whose folder or ``PYTHONPATH`` holds a module of the same name runs the real command
  instead, as does one whose environment changes a variable read at import time:
  ``OMP_*``, ``MKL_*``, ``TORCH*``, ``PYTHON*``, ...); ``/proc/<pid>/environ`` of a fork
  shows the zygote's environment, not the run's. ``DP2DDP_TEST_REAL_LAUNCH=1`` makes
  every launch real (the whole suite then runs as it did before the zygotes).

The exit race of torch 2.13 on gloo
-----------------------------------
A DDP rank on gloo sometimes dies with SIGABRT ("terminate called without an active
exception") while its interpreter shuts down, after all of its work is done. Cause (from
core dumps of such ranks): ``torch.autograd.graph._engine_run_backward`` stashes a
``contextvars.Context`` in the thread-local state for the duration of ``backward()``; every
gloo all-reduce that DDP launches from inside ``backward()`` captures that state; the gloo
worker thread that ran the last all-reduce destroys the work item a moment after the main
thread has already been released from ``wait()``. Destroying it drops the Python object,
which needs the GIL; when the main thread has meanwhile reached ``Py_FinalizeEx``, CPython
3.11 ends a thread that asks for the GIL with ``pthread_exit``, whose forced unwind through
a ``noexcept`` C++ destructor calls ``std::terminate``. Under load (``pytest -n 2`` on two
cores) it hit a few percent of launches.

Two defences, both only in the test harness (the generated scripts are left alone, and
docs/known-issues.md tells users):
* ``EXIT_RACE_GUARD``: a ``sitecustomize`` on ``PYTHONPATH`` of every script the tests
  launch, which sleeps 0.2 s in an ``atexit`` handler of any process that imported
  ``torch.distributed`` — atexit handlers run before the interpreter starts finalizing, and
  the sleep releases the GIL, so the worker thread can finish its destructor in time;
* :func:`retry_exit_abort`: a run that failed *with exactly this signature* is retried, at
  most twice, with a warning.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Union

from tests import _zygote

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
EXIT_RACE_GUARD = Path(__file__).resolve().parent / "exit_race_guard"
TIMEOUT = 180

TEARDOWN_ABORT = ("terminate called without an active exception", "Fatal Python error: Aborted")


def aborted_at_exit(output: str) -> bool:
    return any(sign in output for sign in TEARDOWN_ABORT)


def guarded(env: Dict[str, str]) -> Dict[str, str]:
    """``env`` with the exit-race guard first on ``PYTHONPATH``."""
    path = [str(EXIT_RACE_GUARD)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(env, PYTHONPATH=os.pathsep.join(path))


def _env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("RANK", None)
    env.pop("LOCAL_RANK", None)
    env.pop("WORLD_SIZE", None)
    env["PYTHONUNBUFFERED"] = "1"
    # stand-ins for tqdm / tensorboardX / wandb, which some fixtures import (not dependencies)
    support = str(Path(__file__).resolve().parent.parent / "fixtures" / "corpus" / "_support")
    env["PYTHONPATH"] = os.pathsep.join([support] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return guarded(env)


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_together(
    cmds: Sequence[Sequence[str]],
    cwd: Union[str, Path],
    envs: Sequence[Dict[str, str]],
    timeout: float = TIMEOUT,
    fail_fast: bool = True,
) -> List[subprocess.CompletedProcess]:
    """Run the commands side by side, each in its own session, output (stdout+stderr)
    collected. ``fail_fast``: once one exits non-zero, the others are killed at once (a
    torchrun agent whose peer failed would wait minutes in its exit barrier). On timeout
    every one is killed and the test fails with their output. Nothing outlives the call."""
    procs = [
        subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
        for cmd, env in zip(cmds, envs)
    ]
    outs: List[bytes] = [b""] * len(procs)

    def drain(i: int) -> None:
        outs[i] = procs[i].communicate()[0]

    readers = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(len(procs))]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while any(t.is_alive() for t in readers):
            if time.monotonic() > deadline:
                timed_out = True
                break
            if fail_fast and any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.05)
    finally:
        for p in procs:
            _killpg(p)
        for t in readers:
            t.join()
    texts = [o.decode(errors="replace") for o in outs]
    if timed_out:
        raise AssertionError(
            f"timed out after {timeout}s: "
            + "\n".join(f"{' '.join(map(str, p.args))}\n{text[-3000:]}" for p, text in zip(procs, texts))
        )
    return [subprocess.CompletedProcess(p.args, p.returncode, text, "") for p, text in zip(procs, texts)]


Results = Union[subprocess.CompletedProcess, List[subprocess.CompletedProcess]]


# the rendezvous port picked free was taken before rank 0 bound it (another launch of the
# parallel test session got it in between): a flake of the launch, not of the script
PORT_TAKEN = ("EADDRINUSE", "address already in use")


def port_taken(output: str) -> bool:
    return any(sign in output for sign in PORT_TAKEN)


def retry_exit_abort(attempt: Callable[[], Results], what: str, retries: int = 2) -> Results:
    """``attempt()`` again (at most ``retries`` times, each with a warning) while it failed
    with the signature of torch's exit race (see the module docstring), or because the free
    port its ranks were given was taken before rank 0 listened on it (``PORT_TAKEN``: CI saw
    it once in ~2000 launches of ``pytest -n 2``), and only then."""
    result = attempt()
    for n in range(1, retries + 1):
        runs = result if isinstance(result, list) else [result]
        if all(r.returncode == 0 for r in runs):
            break
        if any(aborted_at_exit(r.stdout or "") for r in runs):
            warnings.warn(f"{what}: a rank aborted at exit (torch 2.13 gloo exit race); retry {n}")
        elif any(r.returncode != 0 and port_taken(r.stdout or "") for r in runs):
            warnings.warn(f"{what}: the rendezvous port was taken before rank 0 listened on it; retry {n}")
        else:
            break
        result = attempt()
    return result


def run(cmd, cwd, timeout: float = TIMEOUT, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    """The real command ``cmd``, always (a new interpreter; torchrun's own launcher)."""
    return run_together([cmd], cwd, [env or _env()], timeout=timeout)[0]


def run_script(argv: Sequence[str], cwd, env: Optional[Dict[str, str]] = None, nproc: Optional[int] = None,
               timeout: float = TIMEOUT, real: bool = False) -> subprocess.CompletedProcess:
    """``python ARGV`` (``nproc`` None) or ``torchrun --standalone --nproc_per_node=NPROC ARGV``
    from ``cwd``: forked from a zygote (see the module docstring) unless ``real``, or where a
    fork would not be faithful (tests/_zygote.py says when); then the real command."""
    env = env or _env()
    if not real:
        done = _zygote.launch(argv, cwd, env, nproc, timeout)
        if done is not None:
            return done
    cmd = [sys.executable, *argv] if nproc is None else [*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", *argv]
    return run(cmd, cwd, timeout=timeout, env=env)


def run_python(script: Path, workdir: Path, *args: str, real: bool = False) -> subprocess.CompletedProcess:
    return run_script([str(script), *args], workdir, real=real)


def run_torchrun(script: Path, workdir: Path, *args: str, nproc: int = 2, real: bool = False) -> subprocess.CompletedProcess:
    return run_script([str(script), *args], workdir, nproc=nproc, real=real)


def copy_to(script: Path, workdir: Path, name: str = "train.py") -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    dest = workdir / name
    shutil.copyfile(script, dest)
    return dest
