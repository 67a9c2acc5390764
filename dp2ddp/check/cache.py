"""The result cache of `dp2ddp check`.

Like ruff's: the findings of a file are stored under the digest of its bytes, in one file
per "settings key" (dp2ddp version and sources, Python and LibCST versions, the selected
codes). Only the parent process writes, once at the end of a run, through a temporary
file and a rename; it merges with what another run may have written meanwhile. Anything
unreadable, truncated or of the wrong shape counts as a miss.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Set

from dp2ddp.check.results import FileResult

CACHE_DIR_NAME = ".dp2ddp_cache"
_MAX_AGE_DAYS = 30  # entries not seen for that long are dropped when the cache is written


def content_digest(data: bytes) -> str:
    import hashlib

    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _code_fingerprint() -> str:
    """dp2ddp's version plus the size and mtime of its sources: an edited rule (editable
    install) invalidates the cache like a new release does."""
    import dp2ddp

    root = os.path.dirname(os.path.abspath(dp2ddp.__file__))
    parts = [dp2ddp.__version__]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "templates", "verify"))
        for f in sorted(filenames):
            if f.endswith(".py"):
                try:
                    st = os.stat(os.path.join(dirpath, f))
                except OSError:
                    continue
                parts.append(f"{os.path.relpath(os.path.join(dirpath, f), root)}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(parts)


def settings_key(codes: Sequence[str]) -> str:
    """Everything besides a file's bytes that its findings depend on (LibCST is not among
    them: it only edits, and fixes are never cached)."""
    import hashlib
    import platform

    material = "\0".join(
        [
            _code_fingerprint(),
            platform.python_implementation(),
            sys.version,
            ",".join(sorted(codes)),
        ]
    )
    return hashlib.sha256(material.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def _valid_entry(value) -> Optional[List[tuple]]:
    """A stored entry as a list of diagnostic tuples (no path); ``None`` if malformed."""
    if not isinstance(value, list) or len(value) != 2 or not isinstance(value[0], int) or not isinstance(value[1], list):
        return None
    out = []
    for d in value[1]:
        if not (isinstance(d, list) and len(d) == 9):
            return None
        line, col, end_line, end_col, code, name, message, fixable, severity = d
        if not all(type(x) is int for x in (line, col, end_line, end_col)):
            return None
        if not all(isinstance(x, str) for x in (code, name, message, severity)) or not isinstance(fixable, bool):
            return None
        out.append((line, col, end_line, end_col, code, name, message, fixable, severity))
    return out


class ResultCache:
    """Findings per file content, for one settings key, stored in ``directory``."""

    def __init__(self, directory: str, codes: Sequence[str]) -> None:
        import dp2ddp

        self.directory = os.path.abspath(directory)
        self.key = settings_key(codes)
        self.path = os.path.join(self.directory, dp2ddp.__version__, f"check-{self.key}.json")
        self.today = int(__import__("time").time() // 86400)
        self.raw: Dict[str, list] = self._read()
        self._valid: Dict[str, Optional[List[tuple]]] = {}

    def _read(self) -> Dict[str, list]:
        import json

        try:
            with open(self.path, "rb") as fh:
                doc = json.loads(fh.read())
        except (OSError, ValueError, UnicodeDecodeError, RecursionError):
            return {}  # no cache yet, or a damaged one: start afresh
        if not isinstance(doc, dict) or doc.get("key") != self.key or not isinstance(doc.get("files"), dict):
            return {}
        return doc["files"]

    def get(self, digest: str) -> Optional[List[tuple]]:
        if digest not in self._valid:
            self._valid[digest] = _valid_entry(self.raw.get(digest))
        return self._valid[digest]

    def save(self, results: Iterable[FileResult]) -> None:
        """Store the new entries of ``results`` (and refresh the ones they used).
        Never raises: a cache that cannot be written is just not written."""
        import json

        from dp2ddp.source import atomic_write

        new: Dict[str, list] = {}
        seen: Set[str] = set()
        for r in results:
            if r.store is None or r.store[0] is None:
                continue
            digest, diags = r.store
            if diags is None:
                entry = self.raw.get(digest)
                if isinstance(entry, list) and entry and entry[0] != self.today:
                    seen.add(digest)
                continue
            new[digest] = [self.today, [[d.line, d.col, d.end_line, d.end_col, d.code, d.name, d.message, d.fixable, d.severity] for d in diags]]
        if not new and not seen:
            return
        try:
            current = self._read()  # what another run may have stored meanwhile
            merged = {**self.raw, **current}
            for digest in seen:
                if isinstance(merged.get(digest), list) and merged[digest]:
                    merged[digest] = [self.today, merged[digest][1]] if len(merged[digest]) == 2 else merged[digest]
            merged.update(new)
            oldest = self.today - _MAX_AGE_DAYS
            files = {k: v for k, v in merged.items() if isinstance(v, list) and v and isinstance(v[0], int) and v[0] >= oldest}
            ensure_cache_dir(self.directory)
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            data = json.dumps({"key": self.key, "files": files}, separators=(",", ":")).encode()
            atomic_write(self.path, data)
        except OSError:
            pass


def ensure_cache_dir(directory: str) -> None:
    """Create the cache folder with ruff's markers: a ``.gitignore`` that ignores the whole
    folder (so it is never committed) and a ``CACHEDIR.TAG`` for backup tools."""
    from dp2ddp.source import atomic_write

    os.makedirs(directory, exist_ok=True)
    gitignore = os.path.join(directory, ".gitignore")
    if not os.path.exists(gitignore):
        atomic_write(gitignore, b"# Automatically created by dp2ddp.\n*\n")
    tag = os.path.join(directory, "CACHEDIR.TAG")
    if not os.path.exists(tag):
        atomic_write(
            tag,
            b"Signature: 8a477f597d28d172789f06886806bc55\n"
            b"# This file is a cache directory tag created by dp2ddp.\n"
            b"# For information about cache directory tags see https://bford.info/cachedir/\n",
        )


