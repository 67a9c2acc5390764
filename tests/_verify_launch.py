"""Test harness only: how ``dp2ddp verify`` starts its runs in the test suite.

``dp2ddp verify`` runs ``LAUNCHER COMMAND...`` instead of ``COMMAND...`` when
``DP2DDP_VERIFY_LAUNCHER`` names a launcher (dp2ddp/verify/runner.py); tests/_zygote.py's
:func:`verify_env` names this file, with the descriptor of the pytest process's verify zygote
(a Python that imported torch once, with verify's ``PYTHONHASHSEED`` and thread counts) in
``DP2DDP_TEST_VERIFY_ZYGOTE``. This launcher stands for the command:

* ``python SCRIPT ARGS``: one fork of the zygote (tests/_zygote_server.py says what a fork
  does as ``python`` would); ``python -I SCRIPT ARGS`` (verify's checkpoint loader) too,
  with nothing but the interpreter's own ``sys.path`` and the PYTHON* variables ignored;
* ``python -m torch.distributed.run --nproc-per-node=N --max-restarts=0 --log-dir=D
  --standalone -- SCRIPT ARGS``: N forks with the environment torchrun gives its workers
  (tests/_zygote.py, :func:`worker_envs`); when one exits non-zero the others get SIGTERM,
  SIGKILL 5 s later, and the exit code is 1, as torchrun's agent does;
* anything else (several nodes, other options), or a run a fork would not reproduce (an
  import-time variable that differs from the zygote's, a module of the zygote shadowed:
  tests/_zygote.py's ``_why_not``): ``exec`` of the command itself.

Each fork writes straight into this process's stdout and stderr (for a run, both are
verify's log of the run). A signal
that ends this process (verify's SIGTERM) goes to the process group of every fork; when the
forks are gone this process dies of the same signal. Killed outright (SIGKILL), it leaves
the zygote server to kill the forks (it does so when a client's connection closes before its
run ended). What a fork does not show: torchrun's agent (its log lines, rendezvous,
restarts) and the run's environment in ``/proc/<pid>/environ`` (the zygote's; so verify's
tag does not find the forks: this process ends them). The tests about those use real launches.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import _zygote  # noqa: E402

TEST_VARS = ("DP2DDP_VERIFY_LAUNCHER", _zygote.VERIFY_ZYGOTE_VAR)
FAILED_PEER_KILL_S = 5.0


def _parse(cmd):
    """``(nproc or None, log_dir, script argv)`` of a command this launcher can fork, else None."""
    if len(cmd) >= 4 and cmd[1:3] == ["-m", "torch.distributed.run"]:
        rest = list(cmd[3:])
        opts = {}
        while rest and rest[0].startswith("-"):
            opt = rest.pop(0)
            if opt == "--":  # the end of torchrun's options: the script and its arguments follow
                break
            key, _, value = opt.partition("=")
            if key not in ("--nproc-per-node", "--max-restarts", "--log-dir", "--standalone"):
                return None
            opts[key] = value
        if "--standalone" not in opts or opts.get("--max-restarts") != "0" or not rest:
            return None
        try:
            nproc = int(opts["--nproc-per-node"])
        except (KeyError, ValueError):
            return None
        return nproc, opts.get("--log-dir") or None, rest
    if len(cmd) >= 2 and not cmd[1].startswith("-"):
        return None, None, list(cmd[1:])
    if len(cmd) >= 3 and cmd[1] == "-I" and not cmd[2].startswith("-"):  # verify's checkpoint loader
        return "isolated", None, list(cmd[2:])
    return None


def _exec(cmd, env) -> None:
    os.execve(cmd[0], cmd, env)


def _die(code: int) -> None:
    if code < 0:  # as the process would have: killed by the signal
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(5)
    os._exit(code & 0xFF if code >= 0 else 1)


def main() -> None:
    cmd = sys.argv[1:]
    env = dict(os.environ)
    descriptor = env.get(_zygote.VERIFY_ZYGOTE_VAR)
    for var in TEST_VARS:
        env.pop(var, None)
    parsed = _parse(cmd) if descriptor else None
    if parsed is None:
        _exec(cmd, env)
    nproc, log_dir, argv = parsed
    z = _zygote.Remote(descriptor)
    cwd = os.getcwd()
    isolated = nproc == "isolated"
    if isolated:
        nproc = None
    why = ("another interpreter" if os.path.realpath(cmd[0]) != os.path.realpath(z.executable)
           else _zygote._why_not(argv, cwd, env, z, isolated=isolated))
    if why is not None:
        with open(os.path.join(os.path.dirname(descriptor), "fallbacks.log"), "a") as fh:
            fh.write(f"{' '.join(cmd)}: {why}\n")
        _exec(cmd, env)

    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))
    if nproc is None:
        envs = [env]
    else:
        errdir = os.path.join(log_dir or cwd, "zygote-launch")
        os.makedirs(errdir, exist_ok=True)
        envs = _zygote.worker_envs(env, nproc, errdir)
    children = []
    try:
        for e in envs:
            children.append(z.start(argv, cwd, e, 1, isolated=isolated, err_fd=2))
    except BaseException:
        for c in children:
            _signal(c, signal.SIGKILL)
        raise
    forwarded = None
    failed_at = None
    while any(c.poll() is None for c in children):
        if stop and forwarded is None:
            forwarded = stop[0]
            for c in children:
                _signal(c, forwarded)
        if nproc is not None and forwarded is None:
            if failed_at is None and any(c.returncode not in (None, 0) for c in children):
                failed_at = time.monotonic()
                for c in children:
                    _signal(c, signal.SIGTERM)
            elif failed_at is not None and time.monotonic() - failed_at > FAILED_PEER_KILL_S:
                for c in children:
                    _signal(c, signal.SIGKILL)
        try:
            select.select([c.conn for c in children if c.returncode is None], [], [], 0.2)
        except InterruptedError:
            pass
    codes = [c.returncode for c in children]
    if forwarded is not None:
        _die(-forwarded)
    if nproc is None:
        _die(codes[0])
    _die(1 if any(codes) else 0)


def _signal(child, sig) -> None:
    if child.returncode is None and child.pid:
        for kill in (os.killpg, os.kill):
            try:
                kill(child.pid, sig)
            except OSError:
                pass


if __name__ == "__main__":
    main()
