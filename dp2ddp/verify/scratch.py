"""Scratch directories: each run works in a mirror of the script's folder, so relative
inputs resolve while everything the script writes stays out of the user's folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List, Optional, Tuple

COPY_MAX = 1 << 20  # files up to 1 MiB are copied; larger ones (data) are linked
BUDGET = 2000  # entries mirrored one by one before whole folders are linked
NO_DESCEND = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules", ".tox", ".mypy_cache"}


class Mirror:
    def __init__(self) -> None:
        self.budget = BUDGET
        self.linked: List[Tuple[Path, float, int]] = []  # (target, mtime, size) of linked files

    def link(self, src: Path, dst: Path) -> None:
        os.symlink(src, dst)
        if src.is_file():
            st = src.stat()
            self.linked.append((src, st.st_mtime, st.st_size))

    def mirror(self, src: Path, dst: Path, avoid: Path) -> None:
        dst.mkdir(parents=True, exist_ok=True)
        try:
            entries = sorted(os.scandir(src), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            s, d = Path(e.path), dst / e.name
            try:
                if s.resolve() == avoid or avoid.is_relative_to(s.resolve()):
                    continue  # never mirror the scratch folder into itself
                self.budget -= 1
                if e.is_dir():
                    if e.name in NO_DESCEND or self.budget <= 0 or e.is_symlink():
                        self.link(s.resolve(), d)
                    else:
                        self.mirror(s, d, avoid)
                elif e.is_file():
                    if e.stat().st_size <= COPY_MAX and self.budget > 0:
                        shutil.copy2(s, d)
                    else:
                        self.link(s.resolve(), d)
            except OSError:
                continue

    def modified(self) -> List[str]:
        """Linked files the run changed in place (it should not have)."""
        out = []
        for p, mtime, size in self.linked:
            try:
                st = p.stat()
            except OSError:
                out.append(str(p))
                continue
            if st.st_mtime != mtime or st.st_size != size:
                out.append(str(p))
        return out


def prepare(script: Path, dest: Path, content: Optional[bytes] = None, mirror: Optional[Mirror] = None) -> Path:
    """Mirror ``script``'s folder into ``dest`` and place the script (or ``content``) there."""
    mirror = mirror or Mirror()
    mirror.budget = BUDGET  # per folder: every run's mirror is made the same way
    mirror.mirror(script.parent, dest, dest.resolve())
    target = dest / script.name
    if target.is_symlink() or target.exists():
        target.unlink()
    target.write_bytes(content if content is not None else script.read_bytes())
    return target
