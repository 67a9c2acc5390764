"""`dp2ddp check --new-only` / ``--since REV``: the lines a change adds, from git."""

from __future__ import annotations

import os
import re
from typing import Dict, List, Optional, Sequence, Set

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


class GitError(Exception):
    pass


def _git(args: List[str], cwd: str) -> str:
    import subprocess

    try:
        proc = subprocess.run(
            ["git", "-c", "core.quotepath=off", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=120,
        )
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    except subprocess.TimeoutExpired:
        raise GitError(f"git {args[0]} timed out") from None
    if proc.returncode != 0:
        raise GitError(proc.stderr.decode(errors="replace").strip().splitlines()[-1] if proc.stderr else f"git {args[0]} failed")
    return proc.stdout.decode("utf-8", "surrogateescape")


_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def added_lines(paths: Sequence[str], since: Optional[str] = None) -> Dict[str, Optional[Set[int]]]:
    """Per file (real path): the line numbers added in the working tree relative to
    ``since`` (default: HEAD — with pre-commit's stash, exactly the staged change).
    ``None`` means the whole file is new (untracked, or absent at ``since``)."""
    start = next((p for p in paths if p != "-"), ".")
    start = start if os.path.isdir(start) else os.path.dirname(os.path.abspath(start)) or "."
    try:
        root = _git(["rev-parse", "--show-toplevel"], start).strip()
    except GitError:
        raise GitError(f"{start}: not inside a git repository (needed by --new-only/--since)") from None
    if since is None:
        try:
            rev = _git(["rev-parse", "--verify", "-q", "HEAD^{commit}"], root).strip()
        except GitError:
            rev = EMPTY_TREE  # no commit yet: everything is new
    else:
        try:
            rev = _git(["rev-parse", "--verify", "-q", f"{since}^{{commit}}"], root).strip()
        except GitError:
            raise GitError(f"--since: unknown revision {since!r}") from None
    specs = [os.path.relpath(os.path.abspath(p), root) for p in paths if p != "-"] or ["."]
    diff = _git(["diff", "--no-color", "--no-ext-diff", "-U0", "-M", "--src-prefix=a/", "--dst-prefix=b/", rev, "--", *specs], root)
    tracked = set(_git(["ls-files", "-z", "--", *specs], root).split("\0"))
    out: Dict[str, Optional[Set[int]]] = {}
    current: Optional[str] = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            target = line[4:]
            current = None if target == "/dev/null" else os.path.realpath(os.path.join(root, target[2:]))
            if current is not None:
                out.setdefault(current, set())
        elif line.startswith("@@") and current is not None:
            m = _HUNK.match(line)
            if m:
                first, count = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
                out[current].update(range(first, first + count))
    result: Dict[str, Optional[Set[int]]] = {}
    for rel in tracked:
        if rel:
            real = os.path.realpath(os.path.join(root, rel))
            result[real] = out.get(real, set())
    for real, lines in out.items():
        result[real] = lines
    return result


def lines_for(path: str, table: Dict[str, Optional[Set[int]]]) -> Optional[Set[int]]:
    """Kept lines of ``path``; ``None`` (all lines) for a file git does not track."""
    real = os.path.realpath(path)
    if real not in table:
        return None
    return table[real]
