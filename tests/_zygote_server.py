"""Test harness only: a Python that has imported torch once and forks a child per script run.

Started by tests/_zygote.py (never imported by the tests): ``python _zygote_server.py SOCKET``
with no ``PYTHONPATH``. It imports torch, torch.distributed, torch.nn, torch.optim,
torch.utils.data and numpy (no thread is running afterwards: it checks), listens on the
unix socket ``SOCKET``, writes one line to stdout (``ready`` and the top-level names of the
modules it holds, JSON), and then serves requests until its stdin closes (the pytest worker
that started it is gone): it then kills every child's process group and exits.

A request is one length-prefixed JSON message ``{"argv", "cwd", "env"}`` (and ``"isolated"``
for ``python -I``) sent with one file
descriptor (where the run's stdout and stderr go), or two (stdout, stderr). The server forks; it answers the pid at
once and, when the child has been reaped, its exit code as ``subprocess`` gives it (``-N``
for a signal), one JSON line each. A client that closes its connection before that (it was
killed) takes its run with it: the child's process group is killed.

The child does what ``python SCRIPT ARGS`` would have done from a fresh interpreter, as far
as a forked one can (tests/_scripts.py lists what it does not cover):

* its own session (so the caller can ``killpg`` it and everything it starts);
* ``os.environ`` replaced by the request's environment, ``cwd``, ``sys.argv``;
* ``sys.path``: the script's folder, the ``PYTHONPATH`` entries, then the interpreter's own;
* stdin ``/dev/null``; stdout and stderr the descriptor received, unbuffered text
  (``python -u`` / ``PYTHONUNBUFFERED``);
* fresh random state (``random`` is reseeded at fork by CPython, numpy's global generator
  and torch's default generator here), as a new process seeds them from the OS;
* the ``sitecustomize`` module found first on the new ``sys.path`` imported, as ``site`` does;
* the script compiled and run as ``__main__`` (``__file__`` absolute, as in 3.9+), an
  uncaught exception printed by ``sys.excepthook`` with exit code 1, ``SystemExit`` as
  CPython handles it;
* then interpreter shutdown up to the point where finalization begins: non-daemon threads
  joined, ``atexit`` handlers run, ``__main__``'s globals dropped and collected (a file
  the script left open is flushed, as finalization would), streams flushed; and
  ``os._exit(code)``: the C-level teardown that torch 2.13's gloo exit race hits (see
  tests/_scripts.py) never runs.
"""

import importlib
import json
import os
import select
import signal
import socket
import struct
import sys

# what the scripts import (torch._dynamo: DistributedDataParallel imports it when built, 800
# modules, most of a DDP script's own start-up); importing them starts no thread (checked)
PRELOAD = (
    "numpy", "torch", "torch.distributed", "torch.nn", "torch.nn.functional", "torch.optim", "torch.optim.lr_scheduler",
    "torch.utils.data", "torch.utils.data.distributed", "torch.nn.parallel", "torch._dynamo",
    "torch.distributed.algorithms.join", "torch.distributed.algorithms.ddp_comm_hooks.default_hooks",
    "torch.distributed.elastic.multiprocessing.errors",
)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _recv_request(conn: socket.socket):
    head, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 4)
    if len(head) < 4:
        raise EOFError("short request")
    (size,) = struct.unpack("!I", head[:4])
    body = head[4:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise EOFError("request cut short")
        body += more
    return json.loads(body.decode()), fds


def _send(conn: socket.socket, obj) -> None:
    try:
        conn.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass


def _exit_code(exc: BaseException) -> int:
    """What CPython's handle_system_exit / PyErr_Print make of an uncaught exception."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code & 0xFF if code >= 0 else code & 0xFF
        try:
            sys.stderr.write(str(code) + "\n")
        except Exception:
            pass
        return 1
    try:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    except Exception:
        pass
    return 1


def _child(request: dict, out_fd: int, err_fd: int) -> None:
    """Runs in the forked child; never returns."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        for fd in {out_fd, err_fd}:
            os.close(fd)

        import io

        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(
            io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="strict", line_buffering=False, write_through=True)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)

        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        argv = list(request["argv"])
        script = os.path.abspath(argv[0])
        if request.get("isolated"):  # python -I: neither the script's folder nor PYTHONPATH
            sys.path[:] = BASE_PATH
        else:
            pythonpath = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            sys.path[:] = [os.path.dirname(os.path.realpath(script))] + pythonpath + BASE_PATH
        sys.argv[:] = argv
        importlib.invalidate_caches()

        import random

        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        import torch

        torch.seed()

        sys.modules.pop("sitecustomize", None)
        sys.dp2ddp_zygote_fork = True  # the exit-race guard's sleep is for finalization, which a fork never reaches
        try:
            import sitecustomize  # noqa: F401  (what site.execsitecustomize does)
        except ImportError as exc:
            if exc.name != "sitecustomize":
                raise
        except Exception as exc:  # site prints and goes on
            sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}\n")

        import types
        from importlib.machinery import SourceFileLoader

        main = types.ModuleType("__main__")
        main.__file__ = script
        main.__cached__ = None
        main.__loader__ = SourceFileLoader("__main__", script)
        main.__builtins__ = __builtins__
        sys.modules["__main__"] = main
        with open(script, "rb") as fh:
            source = fh.read()
        try:
            exec(compile(source, script, "exec", dont_inherit=True), main.__dict__)
            code = 0
        except BaseException as exc:  # noqa: BLE001 - what the interpreter does with it
            code = _exit_code(exc)
        # Py_FinalizeEx, up to finalization: threads, then atexit
        try:
            import threading

            threading._shutdown()
        except BaseException as exc:  # noqa: BLE001
            code = code or _exit_code(exc)
        import atexit

        atexit._run_exitfuncs()
        try:
            main.__dict__.clear()
            import gc

            gc.collect()
        except BaseException:  # noqa: BLE001
            pass
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001
                code = code or 120
    except BaseException:  # noqa: BLE001 - the harness itself failed
        try:
            import traceback

            os.write(2, ("zygote child: " + traceback.format_exc()).encode())
        except BaseException:  # noqa: BLE001
            pass
        code = 1
    os._exit(code)


def main() -> None:
    global BASE_PATH
    path = sys.argv[1]
    # the interpreter's own entries: not this file's folder (sys.path[0]); PYTHONPATH is unset
    BASE_PATH = list(sys.path[1:])
    for name in PRELOAD:
        importlib.import_module(name)
    import gc

    # What the imports made is kept for good: a fork's collections (the one after its run
    # above, and any during it) then skip them, neither walking nor copying on write the
    # pages of a heap that holds torch (0.14 s a collection here), and find what the run made
    gc.collect()
    gc.freeze()
    if _threads() != 1:
        sys.stdout.write(json.dumps({"error": f"{_threads()} threads after the imports: forking would be unsafe"}) + "\n")
        sys.stdout.flush()
        sys.exit(1)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    names = sorted({m.split(".")[0] for m in sys.modules})
    sys.stdout.write(json.dumps({"ready": os.getpid(), "modules": names}) + "\n")
    sys.stdout.flush()

    children = {}  # pid -> connection
    abandoned = set()  # pids whose client went away (killed, waiting to be reaped)

    def reap() -> None:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = children.pop(pid, None)
            abandoned.discard(pid)
            if conn is not None:
                _send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                conn.close()

    while True:
        try:
            watched = [conn for pid, conn in children.items() if pid not in abandoned]
            ready, _, _ = select.select([listener, wake_r, sys.stdin, *watched], [], [], 5.0)
        except InterruptedError:
            continue
        for pid, conn in list(children.items()):
            # the client sends nothing after its request: readable means it has gone (a
            # launcher killed before it could end its runs): the run goes with it
            if conn in ready and pid not in abandoned:
                try:
                    gone = not conn.recv(1, socket.MSG_PEEK)
                except OSError:
                    gone = True
                if gone:
                    abandoned.add(pid)
                    for kill in (os.killpg, os.kill):
                        try:
                            kill(pid, signal.SIGKILL)
                        except OSError:
                            pass
        if wake_r in ready:
            try:
                while os.read(wake_r, 4096):
                    pass
            except BlockingIOError:
                pass
        reap()
        if sys.stdin in ready and not os.read(sys.stdin.fileno(), 4096):
            break  # the pytest worker is gone (or done with us)
        if listener in ready:
            conn, _ = listener.accept()
            try:
                request, fds = _recv_request(conn)
            except (EOFError, OSError, ValueError) as exc:
                _send(conn, {"error": str(exc)})
                conn.close()
                continue
            if len(fds) not in (1, 2):
                for fd in fds:
                    os.close(fd)
                _send(conn, {"error": "expected one or two descriptors"})
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                for other in children.values():
                    other.close()
                os.close(wake_r)
                os.close(wake_w)
                _child(request, fds[0], fds[-1])
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            _send(conn, {"pid": pid})
    for pid in list(children):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    listener.close()
    try:
        os.unlink(path)
    except OSError:
        pass


if __name__ == "__main__":
    main()
