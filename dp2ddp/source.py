"""Reading, parsing and atomically writing Python source files.

Every user mistake (missing file, undecodable bytes, syntax error) becomes a
:class:`InputError` with a one-line message naming the file and line; nothing here ever
leaves a half-written file behind.
"""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
import tempfile
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, List, Optional

if TYPE_CHECKING:  # libcst takes ~0.25 s to import: only when a file is really parsed
    import libcst as cst

STDIN = "-"


class InputError(Exception):
    """A problem with the user's input: reported as one line, exit code 2."""

    def __init__(self, path: str, line: Optional[int], message: str) -> None:
        self.path, self.line, self.message = path, line, message
        loc = f"{path}:{line}" if line else path
        super().__init__(f"{loc}: {message}")


@dataclass
class Source:
    path: str  # as given by the user ("-" for stdin)
    data: bytes

    @property
    def display(self) -> str:
        return display_path(self.path)


def display_path(path: str) -> str:
    """How a path is shown in messages: standard input (``-``) is ``<stdin>``."""
    return "<stdin>" if path == STDIN else path


def read_source(path: str) -> Source:
    if path == STDIN:
        return Source(STDIN, sys.stdin.buffer.read())
    try:
        with open(path, "rb") as fh:
            return Source(path, fh.read())
    except FileNotFoundError:
        raise InputError(path, None, "no such file") from None
    except IsADirectoryError:
        raise InputError(path, None, "is a directory") from None
    except PermissionError:
        raise InputError(path, None, "permission denied") from None
    except OSError as e:
        raise InputError(path, None, e.strerror or str(e)) from None


def _decode_check(src: Source) -> None:
    """Raise InputError with the line of the first byte that does not decode."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(src.data).readline)
    except SyntaxError as e:
        raise InputError(src.display, getattr(e, "lineno", None) or 1, str(e.msg if hasattr(e, "msg") else e)) from None
    try:
        src.data.decode(encoding)
    except UnicodeDecodeError as e:
        line = src.data[: e.start].count(b"\n") + 1
        raise InputError(src.display, line, f"cannot decode byte 0x{src.data[e.start]:02x} as {encoding}") from None
    except LookupError:
        raise InputError(src.display, 1, f"unknown encoding {encoding!r}") from None


def parse(src: Source) -> "cst.Module":
    import libcst as cst

    _decode_check(src)
    try:
        return cst.parse_module(src.data)
    except cst.ParserSyntaxError as e:
        # CPython's own message is the one users know ("'(' was never closed")
        try:
            compile(src.data, src.display, "exec", dont_inherit=True)
        except SyntaxError as se:
            raise InputError(src.display, se.lineno or e.raw_line, f"syntax error: {se.msg}") from None
        except Exception:
            pass
        msg = e.message.strip().splitlines()[0] if e.message else "invalid syntax"
        raise InputError(src.display, e.raw_line, f"syntax error: {msg}") from None
    except Exception as e:  # libcst can raise other errors on exotic input
        raise InputError(src.display, None, f"cannot parse: {e}".splitlines()[0]) from None


def parse_ast(src: Source):
    """``(ast tree, text)`` of a source file; a syntax error becomes an :class:`InputError`
    with CPython's own message and line."""
    import ast

    _decode_check(src)
    from dp2ddp.model.positions import decode

    text = decode(src.data)
    try:
        return ast.parse(text, filename=src.display), text
    except SyntaxError as e:
        raise InputError(src.display, e.lineno, f"syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # null bytes, absurd nesting
        raise InputError(src.display, None, f"cannot parse: {e}".splitlines()[0]) from None


def atomic_write(path: str, data: bytes, like: Optional[str] = None) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename.

    The new file keeps the permission bits of ``like`` (or of ``path`` if it exists)."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, f"{directory} is a file, not a folder")
    mode = None
    for ref in (like, path):
        if ref and os.path.exists(ref):
            mode = stat.S_IMODE(os.stat(ref).st_mode)
            break
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "__pycache__", "node_modules", ".tox", ".nox", "build", "dist"})


def excluded(path: str, patterns: List[str], root: Optional[str] = None) -> bool:
    """``path`` matches one of the ``exclude`` patterns (ruff's meaning): a pattern with a
    ``/`` is a glob relative to ``root`` (the folder of the configuration; default: the
    current directory) that matches the path or a folder above it; a pattern without one
    (``third_party``, ``*_pb2.py``) matches any file or folder of that name in the path."""
    import fnmatch

    if not patterns or path == STDIN:
        return False
    absolute = os.path.abspath(path)
    rel = os.path.relpath(absolute, root or os.getcwd()).replace(os.sep, "/")
    parts = (absolute.replace(os.sep, "/").strip("/") if rel.startswith("../") else rel).split("/")
    for pat in patterns:
        pat = pat.strip().rstrip("/")
        if pat.startswith("./"):
            pat = pat[2:]
        if not pat:
            continue
        if "/" in pat:
            if fnmatch.fnmatch(rel, pat) or any(fnmatch.fnmatch("/".join(parts[:i]), pat) for i in range(1, len(parts))):
                return True
        elif any(fnmatch.fnmatch(part, pat) for part in parts):
            return True
    return False


def iter_python_files(paths: List[str], exclude: Optional[List[str]] = None, root: Optional[str] = None) -> Iterator[str]:
    """Expand directories into their ``*.py`` files (sorted, skipping hidden folders and
    virtual environments); files and ``-`` are passed through unchanged. What ``exclude``
    matches (see :func:`excluded`) is left out, a file named explicitly too (pre-commit
    passes every staged file)."""
    exclude = exclude or []
    for p in paths:
        if p != STDIN and os.path.isdir(p):
            for top, dirs, files in os.walk(p):
                dirs[:] = sorted(
                    d for d in dirs if d not in SKIP_DIRS and not d.startswith(".") and not excluded(os.path.join(top, d), exclude, root)
                )
                for name in sorted(files):
                    if name.endswith(".py"):
                        full = os.path.join(top, name)
                        if not excluded(full, exclude, root):
                            yield full
        elif not excluded(p, exclude, root):
            yield p
