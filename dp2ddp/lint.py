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
from dataclasses import asdict, dataclass, field
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
    return lint_bytes(data, job.path, job.codes, lines=job.lines, fix=job.fix, write=job.write)


def lint_bytes(
    data: bytes,
    path: str,
    codes: Sequence[str],
    lines: Optional[Set[int]] = None,
    fix: bool = False,
    write: bool = False,
) -> FileResult:
    codes = tuple(codes)
    rules = _prefilter(codes).candidates(data)
    result = FileResult(path)
    if not rules:
        return result
    result.parsed = True
    diags, fixes, error = _check(data, path, rules, lines)
    if error:
        result.error = error
        return result
    if fix and fixes is not None:
        an, findings = fixes
        _apply_fixes(result, data, path, an, findings, rules, lines)
        if result.output is not None:
            result.original = data
            if write and path != "-":
                from dp2ddp.source import atomic_write

                atomic_write(path, result.output)
            return result
    result.diagnostics, result.hidden = diags
    return result


def _check(data: bytes, path: str, rules: Sequence[Rule], lines: Optional[Set[int]]):
    """Returns ((diagnostics, hidden), (analysis, kept findings), error)."""
    import libcst as cst
    from libcst.metadata import PositionProvider

    from dp2ddp.analysis import Analysis
    from dp2ddp.engine import locate
    from dp2ddp.source import InputError, Source, parse

    display = "<stdin>" if path == "-" else path
    try:
        module = parse(Source(path, data))
    except InputError as e:
        return ([], 0), None, str(e)
    an = Analysis.from_module(module, display)
    findings = []
    for rule in rules:
        try:
            findings.extend(rule.check(an))
        except RecursionError:
            return ([], 0), None, f"{display}: internal error in {rule.code}: file too deeply nested"
        except Exception as e:  # a bug in a rule must not stop the run; say which
            return ([], 0), None, f"{display}: internal error in {rule.code} ({type(e).__name__}: {e})"
    findings = locate(an.wrapper, findings)
    text_lines = module.code.splitlines()
    positions = an.wrapper.resolve(PositionProvider)
    kept, out, hidden = [], [], 0
    for f in findings:
        line_text = text_lines[f.line - 1] if 0 < f.line <= len(text_lines) else ""
        if "noqa" in line_text and suppressed(f.code, line_text):
            continue
        if lines is not None and f.line not in lines:
            hidden += 1
            continue
        kept.append(f)
        end_line, end_col = f.line, f.col
        if f.node is not None and f.node in positions:
            pos = positions[f.node]
            pos = pos() if type(pos).__name__ == "LazyValue" else pos
            end_line, end_col = pos.end.line, pos.end.column
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
    return (out, hidden), (an, kept), None


def _apply_fixes(result: FileResult, data: bytes, path: str, an, findings, rules, lines) -> None:
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
    # what is left after the fix, on the new text
    (diags, hidden), _, error = _check(new, path, rules, None if lines is None else _shifted(data, new, lines))
    result.diagnostics, result.hidden = diags, hidden
    if error:
        result.error = error


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


# ---------------------------------------------------------------------------- many files


def _worker_init(parent: int) -> None:
    import signal

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


def run_jobs(jobs: List[Job], processes: Optional[int] = None) -> List[FileResult]:
    """Lint all jobs; in a process pool when there are enough files for it to pay."""
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
    pool = ctx.Pool(processes, initializer=_worker_init, initargs=(os.getpid(),))
    try:
        chunk = max(1, min(16, len(jobs) // (processes * 16)))
        results = pool.map(lint_job, jobs, chunksize=chunk)
        pool.close()
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.join()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return results


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
