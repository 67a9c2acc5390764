"""Finding and ending every process a verify run started.

Each process verify starts carries ``DP2DDP_VERIFY_TAG=<tag>`` in its environment and
every descendant inherits it (torchrun starts its workers in sessions of their own, so a
process-group kill alone would miss them). Linux ``/proc`` is scanned for the tag.
"""

from __future__ import annotations

import os
import signal
import time
from typing import List

TAG_VAR = "DP2DDP_VERIFY_TAG"


def _environ_has(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle in fh.read().split(b"\0")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def tagged(var: str, value: str) -> List[int]:
    """Live processes (not zombies) whose environment holds ``var=value``, except us."""
    if not os.path.isdir("/proc"):
        return []
    needle = f"{var}={value}".encode()
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid != me and _environ_has(pid, needle) and _alive(pid):
            out.append(pid)
    return out


def signal_pids(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(pids) -> None:
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def kill_tagged(tag: str, grace: float = 2.0, procs=()) -> None:
    """End every process carrying ``tag``: SIGTERM, ``grace`` seconds, then SIGKILL."""
    pids = tagged(TAG_VAR, tag)
    for p in procs:
        if p.poll() is None and p.pid not in pids:
            pids.append(p.pid)
    if pids:
        signal_pids(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            for p in procs:
                p.poll()
            if not [q for q in pids if _alive(q)]:
                break
            time.sleep(0.05)
    for _ in range(50):
        left = tagged(TAG_VAR, tag)
        left += [p.pid for p in procs if p.poll() is None and p.pid not in left]
        if not left:
            break
        signal_pids(left, signal.SIGKILL)
        time.sleep(0.05)
        reap(left)
    for p in procs:
        try:
            p.wait(timeout=5)
        except Exception:
            pass
