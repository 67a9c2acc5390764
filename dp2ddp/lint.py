"""Running the lint rules over files: pre-filter, parse, check, noqa, fix, in parallel.

Nothing here imports torch. Per file: read the bytes, ask the pre-filter which selected
rules could fire (most files stop here, unparsed), parse once, build one
:class:`~dp2ddp.analysis.Analysis`, run the candidate rules, drop findings suppressed by
``# noqa`` or outside the lines ``--new-only`` keeps, and with ``--fix`` apply every
remaining fix in one pass through :func:`dp2ddp.engine.apply_edits`.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from dp2ddp.rules import BY_CODE, Rule

# ---------------------------------------------------------------------------- results


@dataclass
class Diagnostic:
    path: str
    line: int  # 1-based
    col: int  # 1-based
    end_line: int
    end_col: int
    code: str
    name: str
    message: str
    fixable: bool = False
    severity: str = "warning"


@dataclass
class FileResult:
    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    error: Optional[str] = None  # "path:line: message" for unreadable / unparsable input
    parsed: bool = False
    fixed: int = 0  # number of findings fixed
    output: Optional[bytes] = None  # new contents when fixes changed the file
    hidden: int = 0  # findings dropped because they are on unchanged lines (--new-only)
    original: Optional[bytes] = None  # kept for --diff
    cached: bool = False  # the findings came from the result cache
    # for the result cache: (content digest, every finding of that content, before --new-only)
    store: Optional[Tuple[str, List[Diagnostic]]] = None


@dataclass
class Job:
    path: str
    codes: Tuple[str, ...]
    lines: Optional[Set[int]] = None  # --new-only: the added lines (None: all)
    fix: bool = False  # compute fixes
    write: bool = False  # write fixed files (atomic)
    data: Optional[bytes] = None  # content, when already read (stdin)


# ---------------------------------------------------------------------------- noqa

_NOQA = re.compile(
    r"#\s*noqa(?::[ \t]*(?P<codes>[A-Za-z]+[0-9]+(?:[ \t]*,?[ \t]*[A-Za-z]+[0-9]+)*))?", re.IGNORECASE
)


def noqa_codes(line: str) -> Optional[Set[str]]:
    """``None``: no noqa; empty set: a bare ``# noqa``; else the codes."""
    m = None
    for m in _NOQA.finditer(line):
        pass
    if m is None:
        return None
    codes = m.group("codes")
    if not codes:
        return set()
    return {c.upper() for c in re.findall(r"[A-Za-z]+[0-9]+", codes)}


def suppressed(code: str, line_text: str) -> bool:
    codes = noqa_codes(line_text)
    if codes is None:
        return False
    return not codes or code in codes


# ---------------------------------------------------------------------------- one file

_PREFILTERS: Dict[Tuple[str, ...], object] = {}
# The shortcuts of `check`, each verified to give the same report
# (benchmarks/bench_check.py --verify runs the whole torch tree both ways):
# DP2DDP_NO_PRUNE=1: LibCST reads whole files (no function bodies blanked, see
# dp2ddp/prune_source.py); DP2DDP_REFERENCE=1: no shortcut at all — only the byte and
# import tiers of the pre-filter (no ast tier, no pruning), positions from LibCST's
# PositionProvider over the whole module.
REFERENCE = os.environ.get("DP2DDP_REFERENCE", "") not in ("", "0")
PRUNE = os.environ.get("DP2DDP_NO_PRUNE", "") == "" and not REFERENCE


def _prefilter(codes: Tuple[str, ...]):
    pf = _PREFILTERS.get(codes)
    if pf is None:
        from dp2ddp.prefilter import Prefilter

        pf = _PREFILTERS[codes] = Prefilter([BY_CODE[c] for c in codes])
    return pf


def lint_job(job: Job) -> FileResult:
    from dp2ddp.source import InputError, read_source

    if job.data is None:
        try:
            data = read_source(job.path).data
        except InputError as e:
            return FileResult(job.path, error=str(e))
    else:
        data = job.data
    cache = _CACHE
    digest = None
    if cache is not None:
        digest = content_digest(data)
        hit = cache.get(digest)
        # cached findings carry no fix: a file with something to fix is analysed again
        if hit is not None and not (job.fix and any(d[7] for d in hit)):
            return _from_cache(job.path, digest, hit, job.lines)
    result = lint_bytes(data, job.path, job.codes, lines=job.lines, fix=job.fix, write=job.write)
    if cache is None and result.store is not None:
        result.store = None
    elif result.store is not None and result.store[0] is None:
        result.store = (digest, result.store[1])
    return result


def _from_cache(path: str, digest: str, entry: List[tuple], lines: Optional[Set[int]]) -> FileResult:
    display = "<stdin>" if path == "-" else path
    kept, hidden = _only_lines([Diagnostic(display, *t) for t in entry], lines)
    result = FileResult(path, diagnostics=kept, hidden=hidden, cached=True)
    result.store = (digest, None)  # seen: keeps the entry alive, nothing new to store
    return result


def _only_lines(diags: List[Diagnostic], lines: Optional[Set[int]], findings=None):
    """The diagnostics (and their findings) on ``lines``; with the number dropped."""
    if lines is None:
        return (diags, 0) if findings is None else (diags, findings, 0)
    keep = [i for i, d in enumerate(diags) if d.line in lines]
    hidden = len(diags) - len(keep)
    if findings is None:
        return [diags[i] for i in keep], hidden
    return [diags[i] for i in keep], [findings[i] for i in keep], hidden


def lint_bytes(
    data: bytes,
    path: str,
    codes: Sequence[str],
    lines: Optional[Set[int]] = None,
    fix: bool = False,
    write: bool = False,
) -> FileResult:
    """Lint one file's bytes. ``result.store`` holds what the result cache may keep for
    this content: every finding before ``lines`` filtered them (``None``: nothing)."""
    import gc

    # Python's ``ast`` and LibCST build hundreds of thousands of objects per big file;
    # the cyclic GC would rescan them all at each of its full collections (about half of
    # the analysis time). They die by reference counting when the file is done; what
    # cycles are left are collected once the GC is back on.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _lint_bytes(data, path, codes, lines, fix, write)
    finally:
        if enabled:
            gc.enable()


def _lint_bytes(data, path, codes, lines, fix, write) -> FileResult:
    codes = tuple(codes)
    rules, facts = _prefilter(codes).analyse(data, use_ast=not REFERENCE)
    result = FileResult(path)
    if not rules:
        result.store = (None, [])
        return result
    result.parsed = True
    pruned = None
    if not fix and PRUNE and facts is not None:
        from dp2ddp.prune_source import prune

        pruned = prune(data, facts, rules)
    everything, findings, an, error = _check(data, path, rules, pruned, facts.tree if facts is not None else None)
    if error:
        result.error = error
        return result
    diags, findings, hidden = _only_lines(everything, lines, findings)
    if fix:
        _apply_fixes(result, data, path, codes, an, findings, lines)
        if result.output is not None:
            result.original = data
            if write and path != "-":
                from dp2ddp.source import atomic_write

                atomic_write(path, result.output)
            return result
        if result.error:
            return result
    result.diagnostics, result.hidden = diags, hidden
    result.store = (None, everything)
    return result


def _check(data: bytes, path: str, rules: Sequence[Rule], pruned: Optional[bytes] = None, tree=None):
    """(diagnostics, their findings, analysis, error): every finding of ``rules`` that no
    ``# noqa`` suppresses. With ``pruned`` (``data`` with the function bodies that the
    rules cannot need blanked out, same lines: :mod:`dp2ddp.prune_source`), that is what
    LibCST analyses; ``data`` is the fallback should it not parse. ``tree``: Python's
    ``ast`` of ``data`` (same lines as ``pruned``), for positions by statement."""
    from dp2ddp.analysis import Analysis
    from dp2ddp.engine import locate
    from dp2ddp.source import InputError, Source, parse

    display = "<stdin>" if path == "-" else path
    module = None
    parsed = data
    if pruned is not None:
        try:
            module = parse(Source(path, pruned))
            parsed = pruned
        except InputError:
            module = None  # cannot happen when pruning is right; the full file decides
    try:
        if module is None:
            module = parse(Source(path, data))
    except InputError as e:
        return [], [], None, str(e)
    text = parsed.decode(module.encoding)
    an = Analysis.from_module(module, display, tree, text)
    findings = []
    for rule in rules:
        try:
            findings.extend(rule.check(an))
        except RecursionError:
            return [], [], None, f"{display}: internal error in {rule.code}: file too deeply nested"
        except Exception as e:  # a bug in a rule must not stop the run; say which
            return [], [], None, f"{display}: internal error in {rule.code} ({type(e).__name__}: {e})"
    findings = locate(an.wrapper, findings, an.range_of)
    kept, out = [], []
    for f in findings:
        line_text = an.line_text(f.line)  # from the parsed text: module.code would generate it again
        if "noqa" in line_text and suppressed(f.code, line_text):
            continue
        kept.append(f)
        end_line, end_col = f.line, f.col
        if f.node is not None:
            end = an.range_of(f.node).end
            end_line, end_col = end.line, end.column
        rule = BY_CODE.get(f.code)
        out.append(
            Diagnostic(
                path=display,
                line=f.line,
                col=f.col + 1,
                end_line=end_line,
                end_col=end_col + 1,
                code=f.code,
                name=rule.name if rule else "",
                message=f.message,
                fixable=f.fixable,
                severity=f.severity,
            )
        )
    return out, kept, an, None


def _apply_fixes(result: FileResult, data: bytes, path: str, codes, an, findings, lines) -> None:
    import libcst as cst

    from dp2ddp.engine import apply_edits, collect_edits

    fixable = [f for f in findings if f.fixable]
    if not fixable:
        return
    edits = collect_edits(fixable)
    display = "<stdin>" if path == "-" else path
    try:
        new = apply_edits(an.wrapper, edits).bytes
        cst.parse_module(new)  # never write something that does not parse
        compile(new, display, "exec")
    except Exception as e:
        result.error = f"{display}: fix not applied, it would not produce valid Python ({type(e).__name__}: {e})"
        return
    if new == data:
        return
    result.output = new
    result.fixed = len(fixable)
    # what is left after the fix: exactly what checking the new text reports (the fix may
    # add code that other rules look at, e.g. the DataParallel migration adds DDP code)
    rules = _prefilter(tuple(codes)).candidates(new)
    everything, error = [], None
    if rules:
        everything, _findings, _an, error = _check(new, path, rules)
    if error:
        result.error = error
        return
    kept_lines = None if lines is None else _shifted(data, new, lines)
    result.diagnostics, result.hidden = _only_lines(everything, kept_lines)
    result.store = (content_digest(new), everything)


def _shifted(old: bytes, new: bytes, lines: Set[int]) -> Set[int]:
    """Map kept line numbers of ``old`` to ``new`` (lines the fix added count as kept)."""
    a = old.decode("utf-8", "replace").splitlines()
    b = new.decode("utf-8", "replace").splitlines()
    out: Set[int] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            out.update(j1 + 1 + k for k in range(i2 - i1) if i1 + 1 + k in lines)
        else:
            out.update(range(j1 + 1, j2 + 1))
    return out


# ---------------------------------------------------------------------------- result cache
#
# Like ruff's: the findings of a file are stored under the digest of its bytes, in one
# file per "settings key" (dp2ddp version and sources, Python and LibCST versions, the
# selected rules). Only the parent process writes, once at the end of a run, through a
# temporary file and a rename; it merges with what another run may have written
# meanwhile. Anything unreadable, truncated or of the wrong shape counts as a miss.

CACHE_DIR_NAME = ".dp2ddp_cache"
_MAX_AGE_DAYS = 30  # entries not seen for that long are dropped when the cache is written
_CACHE: "Optional[ResultCache]" = None  # the cache the current run_jobs consults


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
    """Everything besides a file's bytes that its findings depend on."""
    import hashlib
    import platform

    try:
        import libcst

        libcst_version = getattr(libcst, "__version__", "") or libcst.__name__
    except Exception:  # pragma: no cover
        libcst_version = "?"
    material = "\0".join(
        [
            _code_fingerprint(),
            platform.python_implementation(),
            sys.version,
            libcst_version,
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


# ---------------------------------------------------------------------------- many files


def _worker_init(parent: int, cache: "Optional[ResultCache]" = None) -> None:
    import signal

    global _CACHE
    _CACHE = cache  # already there after fork; pickled once per worker with spawn

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and reaps us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:  # die with the parent even if it is killed with SIGKILL
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
        except Exception:  # pragma: no cover - no prctl
            pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def run_jobs(jobs: List[Job], processes: Optional[int] = None, cache: Optional[ResultCache] = None) -> List[FileResult]:
    """Lint all jobs; in a process pool when there are enough files for it to pay. With
    ``cache``, files whose content is in it are not analysed, and the new results are
    stored when all jobs are done."""
    global _CACHE
    _CACHE = cache
    try:
        results = _run_jobs(jobs, processes, cache)
    finally:
        _CACHE = None
    if cache is not None:
        cache.save(results)
    return results


def _run_jobs(jobs: List[Job], processes: Optional[int], cache: Optional[ResultCache]) -> List[FileResult]:
    if processes is None:
        processes = min(os.cpu_count() or 1, 8)
    if processes <= 1 or len(jobs) < 16 or any(j.data is not None for j in jobs):
        return [lint_job(j) for j in jobs]
    import multiprocessing as mp

    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    # warm the pre-filter before forking so every worker inherits it compiled
    if jobs:
        _prefilter(jobs[0].codes)
    import signal

    def _on_term(signum, frame):  # turn SIGTERM into an exception so the pool is reaped
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _on_term) if _main_thread() else None
    pool = ctx.Pool(processes, initializer=_worker_init, initargs=(os.getpid(), cache))
    try:
        # biggest files first, handed out one at a time: a 10,000-line file drawn last
        # (or in one chunk with another) would keep one worker busy while the rest idle
        order = sorted(range(len(jobs)), key=lambda i: -_size(jobs[i].path))
        results: List[Optional[FileResult]] = [None] * len(jobs)
        for i, result in pool.imap_unordered(_indexed_job, [(i, jobs[i]) for i in order], chunksize=1):
            results[i] = result
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return results


def _indexed_job(item: Tuple[int, Job]) -> Tuple[int, FileResult]:
    return item[0], lint_job(item[1])


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ---------------------------------------------------------------------------- git: --new-only / --since

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
