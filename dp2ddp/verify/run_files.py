"""What one run wrote: snapshots of its copy of the project and of the folders its
arguments name, before and after (:class:`Watch`), diffed into :class:`RunOutputs` (files
created, changed and deleted, with the ranks and lines the probe saw write them)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple


SKIP_DIRS = {"__pycache__"}  # bytecode of imported local modules: both runs write it


MAX_ENTRIES = 20000  # per watched folder; beyond it the folder is not compared


NOT_WATCHED = ("/dev", "/proc", "/sys")


Stat = Tuple[int, int]  # size, mtime_ns


def snapshot(root: Path) -> Tuple[Dict[str, Stat], bool]:
    """``relative path -> (size, mtime_ns)`` for every file under ``root`` (``""`` when
    ``root`` is a file), and whether the walk was complete. Symbolic links are never
    followed; links that point out of ``root`` (the run's links to the user's files) are
    not the run's files and are left out."""
    out: Dict[str, Stat] = {}
    try:
        st = root.lstat()
    except OSError:
        return out, True
    if not root.is_dir() or root.is_symlink():
        out[""] = (st.st_size, st.st_mtime_ns)
        return out, True
    base = str(root) + os.sep
    stack = [(root, "")]
    while stack:
        folder, rel = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            name = f"{rel}{e.name}"
            try:
                if e.is_symlink():
                    target = os.path.normpath(os.path.join(folder, os.readlink(e.path)))
                    if not target.startswith(base):
                        continue  # a link to the user's file or folder
                if e.is_dir(follow_symlinks=False):
                    if e.name not in SKIP_DIRS:
                        stack.append((Path(e.path), name + "/"))
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            out[name] = (st.st_size, st.st_mtime_ns)
            if len(out) > MAX_ENTRIES:
                return out, False
    return out, True


def named_paths(args: Sequence[str], cwd: Path, inside: Optional[Path] = None) -> List[Path]:
    """Paths in the script's arguments that resolve outside the run's copy of the project
    (``inside``, default ``cwd``): absolute ones, ``~`` ones and ones that climb out with
    ``..``, as plain arguments or as ``--opt=value``. Kept: existing paths, and new ones
    whose parent folder exists."""
    inside = inside or cwd
    out: List[Path] = []
    for a in args:
        v = a.split("=", 1)[1] if a.startswith("-") and "=" in a else a
        if not v or v.startswith("-"):
            continue
        if not (os.path.isabs(v) or v.startswith("~") or ".." in Path(v).parts):
            continue
        p = Path(os.path.normpath(cwd / os.path.expanduser(v)))
        if p == inside or inside in p.parents or p.parent == p:
            continue
        if str(p).startswith(NOT_WATCHED) or p in out:
            continue
        try:
            if p.exists() or p.parent.is_dir():
                out.append(p)
        except OSError:
            continue
    # a path inside another watched one is covered by it
    return [p for p in out if not any(q != p and q in p.parents for q in out)]


@dataclass
class Root:
    label: str  # "" for the run's own copy of the project, else the path as shown
    path: Path
    before: Dict[str, Stat] = field(default_factory=dict)
    complete: bool = True


@dataclass
class RunOutputs:
    """What one run created, changed and deleted, by displayed path."""

    role: str
    files: Dict[str, int] = field(default_factory=dict)  # created or changed: size
    created: Set[str] = field(default_factory=set)
    deleted: Set[str] = field(default_factory=set)
    where: Dict[str, Path] = field(default_factory=dict)  # displayed path -> absolute path
    writers: Dict[str, Set[int]] = field(default_factory=dict)  # displayed path -> ranks that wrote it
    appenders: Dict[str, Set[int]] = field(default_factory=dict)  # displayed path -> ranks that only appended to it
    sites: Dict[str, str] = field(default_factory=dict)  # displayed path -> "file.py:line" that opened or saved it
    steps: Dict[str, int] = field(default_factory=dict)  # displayed path -> step of its last write
    outside: List[str] = field(default_factory=list)  # written outside every watched folder
    incomplete: List[str] = field(default_factory=list)
    pids: Dict[int, int] = field(default_factory=dict)  # rank -> pid
    stopped: bool = False  # stopped by verify after --steps steps
    roots: List[str] = field(default_factory=list)
    cwd: Optional[Path] = None  # where the run started
    syspath: List[str] = field(default_factory=list)  # what the project's own code would import from
    work: Optional[Path] = None  # where verify may put what it derives (flattened checkpoints)
    base: Optional[Path] = None  # the run's copy of the project: the files of ``sites`` are relative to it


class Watch:
    """Snapshots of one run's copy of the project (``root``) and of the folders its
    arguments name, taken just before the run; :meth:`after` diffs them once it has ended.
    Paths are shown relative to the folder the run starts in (``cwd``)."""

    def __init__(self, root: Path, args: Sequence[str], cwd: Optional[Path] = None, syspath: Sequence[str] = ()) -> None:
        self.cwd = cwd or root
        self.base = root
        self.syspath = [str(p) for p in syspath] or [str(self.cwd), str(root)]
        self.roots = [Root("", root)] + [Root(str(p), p) for p in named_paths(args, self.cwd, root)]
        for r in self.roots:
            r.before, r.complete = snapshot(r.path)

    def show(self, r: Root, rel: str) -> str:
        if r.label:
            return _join(r.label, rel)
        shown = os.path.relpath(r.path / rel, self.cwd) if rel else "."
        return Path(shown).as_posix()

    def after(self, run, work: Optional[Path] = None) -> RunOutputs:
        out = RunOutputs(role=run.role, cwd=self.cwd, syspath=self.syspath, work=work, base=self.base)
        out.roots = [r.label or "." for r in self.roots]
        for r in self.roots:
            now, complete = snapshot(r.path)
            if not (complete and r.complete):
                out.incomplete.append(r.label or ".")
                continue
            for rel, st in now.items():
                shown = self.show(r, rel)
                old = r.before.get(rel)
                if old is None or old != st:
                    out.files[shown] = st[0]
                    out.where[shown] = r.path / rel if rel else r.path
                    if old is None:
                        out.created.add(shown)
            out.deleted.update(self.show(r, rel) for rel in r.before if rel not in now)
        temp = tempfile.gettempdir()
        for rank, rec in sorted(run.ranks.items(), reverse=True):  # the lowest rank's site wins
            if rec.pid:
                out.pids[rank] = rec.pid
            if rec.end and rec.end.get("why") == "limit":
                out.stopped = True
            for path in rec.writes:
                shown = self._shown(path)
                if shown is not None:
                    out.writers.setdefault(shown, set()).add(rank)
                    if path in (getattr(rec, "write_appends", None) or ()):
                        out.appenders.setdefault(shown, set()).add(rank)
                    site = (rec.write_sites or {}).get(path)
                    if site:
                        out.sites[shown] = self.site(site)
                    if path in (rec.write_steps or {}):
                        out.steps[shown] = rec.write_steps[path]
                elif not path.startswith(NOT_WATCHED + (temp + os.sep,)) and path not in out.outside:
                    out.outside.append(path)
        return out

    def site(self, site) -> str:
        """``file.py:line`` of a probe site, the file relative to the project's copy."""
        path, line = site
        p = Path(path)
        name = p.relative_to(self.base).as_posix() if p == self.base or self.base in p.parents else p.name
        return f"{name}:{line}"

    def _shown(self, path: str) -> Optional[str]:
        for candidate in (path, os.path.realpath(path)):
            p = Path(candidate)
            for r in self.roots:
                if p == r.path:
                    return self.show(r, "")
                if r.path in p.parents:
                    rel = p.relative_to(r.path).as_posix()
                    if any(part in SKIP_DIRS for part in rel.split("/")):
                        return None
                    return self.show(r, rel)
        return None


def _join(label: str, rel: str) -> str:
    if not label:
        return rel
    return f"{label}/{rel}" if rel else label
