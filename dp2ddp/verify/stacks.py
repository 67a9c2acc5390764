"""Turn a faulthandler dump into one line per rank: where it is and what it waits for."""

from __future__ import annotations

import linecache
import os
import re
from dataclasses import dataclass
from typing import List, Optional, Tuple

_FRAME = re.compile(r'^\s*File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")

# (path fragment, function) -> what the rank is doing when its innermost frame is there
_WAITS: List[Tuple[str, str, str]] = [
    ("torch/autograd/", "", "all-reduce of gradients"),
    ("torch/distributed/distributed_c10d.py", "barrier", "dist.barrier"),
    ("torch/distributed/distributed_c10d.py", "all_reduce", "dist.all_reduce"),
    ("torch/distributed/distributed_c10d.py", "broadcast", "dist.broadcast"),
    ("torch/distributed/distributed_c10d.py", "all_gather", "dist.all_gather"),
    ("torch/distributed/distributed_c10d.py", "reduce", "dist.reduce"),
    ("torch/distributed/distributed_c10d.py", "init_process_group", "rendezvous (init_process_group)"),
    ("torch/distributed/rendezvous.py", "", "rendezvous (init_process_group)"),
    ("torch/distributed/distributed_c10d.py", "", "a collective"),
    ("torch/nn/parallel/distributed.py", "_sync_buffers", "buffer broadcast in DDP forward"),
    ("torch/nn/parallel/distributed.py", "__init__", "parameter broadcast in DDP(...)"),
    ("torch/nn/parallel/distributed.py", "", "DDP"),
    ("torch/utils/data/", "", "DataLoader"),
]


@dataclass
class Frame:
    file: str
    line: int
    func: str


@dataclass
class Location:
    rank: int
    frame: Optional[Frame]  # innermost frame in the user's script(s)
    code: str  # that line's source
    waiting: str  # what the library below it is doing, if known
    frames: List[Frame]

    def describe(self, base: str = "") -> str:
        if self.frame is None:
            inner = self.frames[0] if self.frames else None
            where = f"{inner.file}:{inner.line} in {inner.func}" if inner else "no Python stack (native code or exited)"
            return f"rank {self.rank}: {where}"
        name = os.path.relpath(self.frame.file, base) if base else os.path.basename(self.frame.file)
        if name.startswith(".."):
            name = os.path.basename(self.frame.file)
        what = self.code
        if self.waiting:
            what = f"{what} → {self.waiting}" if what else self.waiting
        return f"rank {self.rank}: {name}:{self.frame.line} in {self.frame.func}" + (f" ({what})" if what else "")


def main_thread_frames(dump: str) -> List[Frame]:
    """Frames of the thread that handled the signal (the main thread), innermost first."""
    threads: List[Tuple[bool, List[Frame]]] = []
    for line in dump.splitlines():
        m = _THREAD.match(line)
        if m:
            threads.append((m.group(1) == "Current thread", []))
            continue
        f = _FRAME.match(line)
        if f and threads:
            threads[-1][1].append(Frame(f.group("file"), int(f.group("line")), f.group("func")))
    # the last dump wins (a file may hold several)
    for current, frames in reversed(threads):
        if current:
            return frames
    return threads[-1][1] if threads else []


def _is_user(path: str, user_dirs: List[str]) -> bool:
    if "_dp2ddp_verify_probe" in path or "site-packages" in path or "/lib/python" in path:
        return False
    return any(os.path.abspath(path).startswith(d) for d in user_dirs) if user_dirs else True


def _call_of(code: str) -> str:
    m = re.search(r"([A-Za-z_][\w.]*)\s*\(", code)
    return m.group(1) if m else code


def locate(rank: int, dump: str, user_dirs: List[str], distributed: bool = True) -> Location:
    frames = main_thread_frames(dump)
    dirs = [os.path.abspath(d) + os.sep for d in user_dirs]
    user = next((f for f in frames if _is_user(f.file, dirs)), None)
    code = ""
    waiting = ""
    if user is not None:
        code = linecache.getline(user.file, user.line).strip()
        inner = frames[: frames.index(user)]
        for f in inner:
            path = f.file.replace(os.sep, "/")
            hit = next((w for frag, fn, w in _WAITS if frag in path and (not fn or f.func == fn)), None)
            if hit:
                waiting = hit
                break
        if waiting == "all-reduce of gradients" and not distributed:
            waiting = "autograd backward"
        if inner and not waiting:
            waiting = inner[0].func
        call = _call_of(code)
        code = call if call else code
    return Location(rank, user, code, waiting, frames)
