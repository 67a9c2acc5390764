"""Scratch folders: each run works in a mirror of the user's project, so imports from the
project root and relative inputs resolve as in the user's own launch, while everything the
script writes stays out of the user's tree.

The mirror of the project root holds real folders along the way to the script's folder and
to the folder the run starts in; the script's folder is copied (small files; large ones
and tool folders linked), every other entry is a symbolic link to the user's file or
folder. Nothing of the user's is ever written through those links: the probe's guard (in
every process of a run) replaces a link by a copy of what it points to before anything
writes through it, and refuses writes into the project itself; after the run,
:meth:`Mirror.modified` checks every linked file and folder as a last line of defence.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

COPY_MAX = 1 << 20  # files up to 1 MiB are copied; larger ones (data) are linked
BUDGET = 2000  # entries mirrored one by one before whole folders are linked
NO_DESCEND = {".git", ".hg", ".svn", ".venv", "venv", "node_modules", ".tox", ".mypy_cache"}
NEVER = {"__pycache__"}  # bytecode caches are not mirrored: each run writes its own
MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")


def project_root(script: Path, given: Optional[Path] = None) -> Path:
    """The folder the project lives in: ``given``, else the nearest folder above the script
    that holds pyproject.toml, setup.py, setup.cfg or .git, else the script's folder."""
    if given is not None:
        return given.resolve()
    folder = script.resolve().parent
    found = folder
    for d in (folder, *folder.parents):
        if any((d / m).exists() for m in MARKERS):
            found = d
            break
    # a folder the script puts on sys.path (``sys.path.append(dirname(dirname(abspath(__file__))))``,
    # ``sys.path.insert(0, "..")``), one a module beside it puts there (``_init_paths.py`` adding
    # ``../lib``), and one the script adds relative to its folder, where a run starts by
    # default (``sys.path.append(dirname(abspath(dirname("optimizers"))))``: the folder
    # above it): the project reaches over those too (the facts are module_files')
    from dp2ddp.model.module_files import path_roots, script_path_edits

    own = script_path_edits(str(script.resolve()), str(folder))
    for extra in map(Path, list(path_roots(str(folder), importer=str(script))) + own):
        common = Path(os.path.commonpath([found, extra]))
        if common != found and common in list(folder.parents)[:3]:  # up to three folders above
            found = common
    return found


def run_cwd(root: Path, script: Path, cwd: Path) -> Path:
    """Where the runs start, as in the user's tree: the folder verify was started from when
    it lies in the project (the user launches ``python scripts/train.py`` from there), else
    the script's folder."""
    cwd = cwd.resolve()
    return cwd if cwd == root or root in cwd.parents else script.resolve().parent


@dataclass
class Place:
    """One run's copy of the project."""

    root: Path  # the mirror of the project root
    script: Path  # the script inside it
    cwd: Path  # where the run starts

    def mirrored(self, user_root: Path, path: Path) -> Path:
        """The mirror's counterpart of a path in the user's project."""
        return self.root / path.relative_to(user_root)


HASH_BUDGET = 256 << 20  # bytes of linked files fingerprinted per session, at most


def _digest(path: Path) -> Optional[str]:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return None
    return h.hexdigest()


class Mirror:
    def __init__(self) -> None:
        self.budget = BUDGET
        self.linked: Dict[Path, Tuple[int, int, int]] = {}  # target -> (mtime_ns, size, ctime_ns)
        # target -> its content's digest when linked (files, while HASH_BUDGET lasts): a file a
        # C library opened for writing without changing a byte (h5py's "r+") is told apart
        self.digests: Dict[Path, str] = {}
        self.hash_budget = HASH_BUDGET

    def link(self, src: Path, dst: Path) -> None:
        os.symlink(src, dst)
        if src not in self.linked:
            try:
                st = src.stat()
            except OSError:
                return
            self.linked[src] = (st.st_mtime_ns, st.st_size, st.st_ctime_ns)
            if stat.S_ISREG(st.st_mode) and st.st_size <= self.hash_budget:
                digest = _digest(src)
                if digest is not None:
                    self.digests[src] = digest
                    self.hash_budget -= st.st_size

    def touched(self) -> List[str]:
        """Linked files whose times changed during the runs but whose contents did not (known
        by their digest): opened for writing by code the guard does not see, nothing written."""
        return [str(p) for p in self._changed_files() if self._same_content(p)]

    def _same_content(self, p: Path) -> bool:
        return self.digests.get(p) is not None and _digest(p) == self.digests[p]

    def _changed_files(self) -> List[Path]:
        """Linked files (or entries gone) whose times or size changed during the runs."""
        out = []
        for p, (mtime, size, ctime) in self.linked.items():
            try:
                st = p.stat()
            except OSError:
                out.append(p)
                continue
            if not stat.S_ISDIR(st.st_mode) and (st.st_mtime_ns, st.st_size, st.st_ctime_ns) != (mtime, size, ctime):
                out.append(p)
        return out

    def mirror(self, src: Path, dst: Path, avoid: Path) -> None:
        """Copy the folder ``src`` (small files; larger ones, tool folders and whatever lies
        beyond the budget linked) into ``dst``."""
        dst.mkdir(parents=True, exist_ok=True)
        try:
            entries = sorted(os.scandir(src), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            s, d = Path(e.path), dst / e.name
            if e.name in NEVER:
                continue
            try:
                if _avoided(s, avoid):
                    continue  # never mirror the scratch folder into itself
                self.budget -= 1
                if e.is_dir():
                    if e.name in NO_DESCEND or self.budget <= 0 or e.is_symlink():
                        self.link(s.resolve(), d)
                    else:
                        self.mirror(s, d, avoid)
                elif e.is_file():
                    if e.stat().st_size <= COPY_MAX and self.budget > 0 and not e.is_symlink():
                        shutil.copy2(s, d)
                    else:
                        self.link(s.resolve(), d)
            except OSError:
                continue

    def chain(self, src: Path, dst: Path, rel: Path, ways: Sequence[Path], full: Path, avoid: Path) -> None:
        """Mirror the project folder ``src`` (``rel`` inside the project): real folders along
        ``ways`` (the folders the run needs to be real; small files of the last of them, where
        the run starts, copied), ``full`` copied, the rest linked."""
        if rel == full:
            self.mirror(src, dst, avoid)
            return
        dst.mkdir(parents=True, exist_ok=True)
        try:
            entries = sorted(os.scandir(src), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            s, d, r = Path(e.path), dst / e.name, rel / e.name
            if e.name in NEVER:
                continue
            try:
                if _avoided(s, avoid):
                    continue
                if e.is_dir() and any(r == w or r in w.parents for w in ways):
                    self.chain(s, d, r, ways, full, avoid)
                elif rel == ways[-1] and e.is_file() and not e.is_symlink() and e.stat().st_size <= COPY_MAX:
                    self.budget -= 1
                    if self.budget > 0:
                        shutil.copy2(s, d)
                    else:
                        self.link(s.resolve(), d)
                else:
                    self.link(s.resolve(), d)
            except OSError:
                continue

    def modified(self, folders: bool = False) -> List[str]:
        """Linked files the runs changed (the guard should have kept them from it; a file whose
        times changed but not a byte is :meth:`touched` instead); with ``folders``, linked
        folders whose entries changed instead (by the runs, or by you working in the project
        meanwhile: an editor saving a file)."""
        if not folders:
            return [str(p) for p in self._changed_files() if not self._same_content(p)]
        out = []
        for p, (mtime, _size, _ctime) in self.linked.items():
            try:
                if p.is_dir() and p.stat().st_mtime_ns != mtime:  # an entry added or removed
                    out.append(str(p) + os.sep)
            except OSError:
                continue
        return out


def _avoided(path: Path, avoid: Path) -> bool:
    r = path.resolve()
    return r == avoid or avoid.is_relative_to(r)


def prepare(script: Path, dest: Path, content: Optional[bytes] = None, mirror: Optional[Mirror] = None,
            root: Optional[Path] = None, cwd: Optional[Path] = None, at: Optional[Path] = None,
            overlays: Optional[Dict[Path, bytes]] = None) -> Place:
    """Mirror the project ``root`` (default: the script's folder) into ``dest`` and place the
    script (or ``content``) at ``at`` (a path relative to the root; default: where it is).
    ``cwd``: the folder in the user's project the run starts in (default: the script's).
    ``overlays``: files (paths relative to the root) whose content this run sees instead of
    the project's: the migrated helper modules of a project migration (their folders are
    made real, so nothing is written through a link)."""
    mirror = mirror or Mirror()
    mirror.budget = BUDGET  # per run: every run's mirror is made the same way
    script = script.resolve()
    root = (root or script.parent).resolve()
    rel = at if at is not None else script.relative_to(root)
    start = (cwd or script.parent).resolve()
    rel_cwd = start.relative_to(root) if start == root or root in start.parents else rel.parent
    overlays = overlays or {}
    ways = [rel.parent, *sorted({p.parent for p in overlays}), rel_cwd]
    dest.mkdir(parents=True, exist_ok=True)
    mirror.chain(root, dest, Path("."), ways, rel.parent, dest.resolve())
    for path, data in sorted(overlays.items()):
        _place_file(dest, dest / path, data)
    target = dest / rel
    _place_file(dest, target, content if content is not None else script.read_bytes())
    run_dir = dest / rel_cwd
    run_dir.mkdir(parents=True, exist_ok=True)
    return Place(root=dest, script=target, cwd=run_dir)


def relative_in(root: Path, path: Path) -> Optional[Path]:
    """``path`` (absolute, normalised here) relative to ``root``; ``None`` outside it."""
    norm = Path(os.path.normpath(path))
    return norm.relative_to(root) if norm.is_relative_to(root) else None


def in_root(root: Path, files: Dict[Path, bytes]) -> Dict[Path, bytes]:
    """``files`` (absolute paths) keyed by their path relative to ``root``; those outside it
    are left out (a run's copy holds only the project)."""
    out = {}
    for path, data in files.items():
        rel = relative_in(root, path)
        if rel is not None:
            out[rel] = data
    return out


def migrated_modules(original: Path, migrated: Path) -> Dict[Path, bytes]:
    """The project modules the original imports whose copy beside the migrated script differs
    from the original's: a project migrated by ``rewrite --with-helpers -o DIR`` keeps the
    layout, so ``DIR/train.py`` comes with ``DIR/networks/__init__.py``. Absolute path of the
    original's module -> the migrated content."""
    from dp2ddp.project import project_modules

    out: Dict[Path, bytes] = {}
    if migrated.parent.resolve() == original.parent.resolve():
        return out
    for real, (rel, _depth) in project_modules(str(original)).items():
        try:
            theirs = (migrated.parent / rel).read_bytes()
            if theirs != Path(real).read_bytes():
                out[original.resolve().parent / rel] = theirs
        except OSError:
            continue
    # modules further than those imports (pytorch-template's base/base_trainer.py, four imports
    # away, migrated for the trainer class the entry makes): any module of the copy's folder
    # that differs from the original's beside it
    for path in _python_files(migrated.parent, skip=migrated):
        rel = path.relative_to(migrated.parent)
        mine = original.resolve().parent / rel
        if mine in out:
            continue
        try:
            theirs = path.read_bytes()
            if mine.is_file() and theirs != mine.read_bytes():
                out[mine] = theirs
        except OSError:
            continue
    return out


_NOT_CODE = frozenset({"__pycache__", ".git", ".hg", "node_modules", "venv", ".venv", "site-packages"})


def _python_files(folder: Path, skip: Path, limit: int = 5000):
    """The ``.py`` files under ``folder`` (hidden and environment folders left out), at most ``limit``."""
    seen = 0
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _NOT_CODE and not d.startswith("."))
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = Path(root) / name
            if path == skip:
                continue
            seen += 1
            if seen > limit:
                return
            yield path


def _place_file(dest: Path, target: Path, data: bytes) -> None:
    """Write ``data`` at ``target`` in the scratch copy ``dest``, replacing a link there
    (never writing through it)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.parent.resolve().is_relative_to(dest.resolve()):
        raise OSError(f"{target.parent}: not a folder of the scratch copy")
    if target.is_symlink() or target.exists():
        target.unlink()
    target.write_bytes(data)


def remap(args: Sequence[str], user_root: Path, mirror_root: Path) -> List[str]:
    """The script's arguments with absolute (or ``~``) paths into the user's project pointed at
    the run's copy of it instead (as plain arguments or as ``--opt=value``)."""
    out = []
    root = str(user_root)
    for a in args:
        head, sep, v = a.partition("=") if a.startswith("-") and "=" in a else ("", "", a)
        p = os.path.expanduser(v) if v.startswith("~") else v
        if os.path.isabs(p):
            norm = os.path.normpath(p)
            if norm == root or norm.startswith(root + os.sep):
                v = str(mirror_root / os.path.relpath(norm, root))
        out.append(head + sep + v)
    return out
