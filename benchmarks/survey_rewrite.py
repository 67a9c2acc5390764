"""Survey `dp2ddp rewrite` (and `dp2ddp check` on its output) over a corpus of real files.

    python benchmarks/survey_rewrite.py PATH... [--files-from LIST] [--all-files]
        [--json OUT.json] [--write-outputs DIR] [--check-subprocess] [--no-check-inputs]

PATH: files or directories. Directories are walked for ``*.py`` files, of which only the
ones that mention DataParallel (``DataParallel`` not preceded by Distributed/Sharded, any
case, or ``data_parallel(``) are surveyed unless ``--all-files``; named files and
``--files-from`` lists (one path a line, ``#`` comments) are surveyed as given.

Each file gets one status:

  migrated     the rewrite changed it and did not block;
  refused      the rewrite blocked (grouped by finding code + a normalised message);
  warned-only  nothing changed, not blocked, but warnings were reported;
  silent       the file mentions DataParallel in code (a NAME token, not only comments
               or strings) and the rewrite reports nothing at all: the worst case;
  text-only    as silent, but the mentions are only in comments/strings (benign);
  no-mention   nothing to migrate and no mention at all;
  parse-error  the rewrite rejected the input (``InputError``: syntax, encoding);
  crash        any other exception inside the rewrite (a dp2ddp bug).

Each migrated output is checked: it compiles (``compile()``), it is idempotent (the
rewrite of the output changes nothing), no DataParallel is left in its code, no comment
of the input is lost, no static sign of a misplaced edit (``structure_flags``);
``dp2ddp check`` (default rules) is run on it and its findings counted by code.
``dp2ddp check`` is also run on every input (``--no-check-inputs`` to skip), which shows
where the check and the rewrite disagree (e.g. DDP001 on a file the rewrite is silent
about).

``--projects`` adds what a user runs on a project (``dp2ddp rewrite ENTRY --with-helpers``):
every folder directly under each PATH is one repository; its entry scripts (files with a
``__main__`` guard or module-level code that runs: loops, ``with``, calls) are migrated in
project mode, and each surveyed library module (no entry point of its own) that such a
migration plans as a helper gets that migration's outcome instead of its own:

  migrated     the project migration of an entry edits it and does not block (``project``:
               the entry; its output is checked as above, but not rewritten a second time);
  refused      every project migration that reaches it blocks (the reasons are the
               project's blocking findings, ``project_at``: the file and line of each);
  otherwise    no entry reaches it (or none edits it): it keeps its status alone.

An entry refused alone whose project migration edits it and does not block (refused alone
for want of its helpers: DDP166) gets ``migrated`` from that migration too.

The per-file statuses are kept in the summary (``per_file_status``), with one line per
project migration (entry, helpers, outcome).

Never imports torch. The calls into dp2ddp are isolated in ``run_rewrite``, ``run_check``
and ``run_project`` below: when the rewrite, check or project API changes, adapt those only.
"""

from __future__ import annotations

import argparse
import collections
import difflib
import io
import json
import os
import re
import subprocess
import sys
import time
import tokenize
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


# ============================================================================ the two API calls


@dataclass
class RewriteOutcome:
    changed: bool
    output: bytes
    blocked: bool
    applicable: bool
    # (code, severity, message, line) for every finding the rewrite reported
    findings: List[Tuple[str, str, str, int]] = field(default_factory=list)
    input_error: Optional[str] = None  # the input was rejected (syntax, encoding)


def run_rewrite(data: bytes, path: str) -> RewriteOutcome:
    """One file through the rewrite, in process. Raises on internal errors (a crash)."""
    from dp2ddp.migrate import migrate_bytes
    from dp2ddp.source import InputError

    try:
        r = migrate_bytes(data, path)
    except InputError as e:
        return RewriteOutcome(False, data, False, False, input_error=str(e))
    m = r.migration
    findings = [(f.code, f.severity, f.message, f.line) for f in m.findings]
    return RewriteOutcome(r.changed, r.output, m.blocked, m.applicable, findings)


@dataclass
class ProjectFile:
    path: str  # real path
    role: str  # entry | helper | script
    changed: bool
    output: bytes
    blocked: bool
    findings: List[Tuple[str, str, str, int]] = field(default_factory=list)


@dataclass
class ProjectOutcome:
    entry: str
    blocked: bool
    files: List[ProjectFile] = field(default_factory=list)
    input_error: Optional[str] = None


def run_project(entry: str) -> Optional[ProjectOutcome]:
    """``dp2ddp rewrite ENTRY --with-helpers`` in process, planned as the CLI plans it
    (nothing written). ``None`` where no project module the entry imports uses DataParallel
    (the CLI's plan then has no helper to attribute). Raises on internal errors (a crash)."""
    from dp2ddp.migrate import migrate_project
    from dp2ddp.project import project_modules, uses_dp
    from dp2ddp.source import InputError

    if not any(uses_dp(real) for real in project_modules(entry)):
        return None
    try:
        p = migrate_project(entry)
    except InputError as e:
        return ProjectOutcome(entry, True, input_error=str(e))
    files = [
        ProjectFile(os.path.realpath(f.path), f.role, f.result.changed, f.result.output, f.result.migration.blocked,
                    [(x.code, x.severity, x.message, x.line) for x in f.result.migration.findings])
        for f in p.files
    ]
    return ProjectOutcome(entry, p.blocked, files)


_DEFAULT_CODES: Optional[Tuple[str, ...]] = None


def run_check(data: bytes, path: str, subprocess_mode: bool = False) -> Tuple[List[Tuple[str, int, str]], Optional[str]]:
    """``dp2ddp check`` with the default rules on ``data``: ``([(code, line, message)], error)``."""
    if subprocess_mode:
        proc = subprocess.run(
            [sys.executable, "-m", "dp2ddp", "check", "--format", "json", "--no-cache", "--no-config", "--exit-zero", "-"],
            input=data,
            capture_output=True,
            cwd=str(ROOT),
        )
        try:
            items = json.loads(proc.stdout.decode() or "[]")
        except ValueError:
            return [], f"exit {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[-300:]}"
        diags, error = [], None
        for i in items:
            if i.get("code") is None:
                error = i.get("message")
            else:
                diags.append((i["code"], (i.get("location") or {}).get("row", 0), i.get("message", "")))
        if proc.returncode not in (0, 1) and error is None:
            error = f"exit {proc.returncode}: {proc.stderr.decode(errors='replace').strip()[-300:]}"
        return diags, error

    global _DEFAULT_CODES
    from dp2ddp.check.engine import check_bytes

    if _DEFAULT_CODES is None:
        from dp2ddp.registry import select

        _DEFAULT_CODES = tuple(select())
    res = check_bytes(data, path, _DEFAULT_CODES)
    return [(d.code, d.line, d.message) for d in res.diagnostics], res.error


# ============================================================================ corpus

_MENTION = re.compile(r"(?<!distributed)(?<!sharded)dataparallel|data_parallel\s*\(", re.IGNORECASE)
_MENTION_NAME = re.compile(r"(?<!distributed)(?<!sharded)dataparallel|^data_parallel$", re.IGNORECASE)


def mentions(data: bytes) -> bool:
    return _MENTION.search(data.decode("utf-8", "replace")) is not None


def code_mentions(data: bytes) -> Optional[int]:
    """How many NAME tokens mention DataParallel (None: the file does not tokenize)."""
    try:
        toks = list(tokenize.tokenize(io.BytesIO(data).readline))
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, IndentationError):
        return None
    return sum(1 for t in toks if t.type == tokenize.NAME and _MENTION_NAME.search(t.string))


def comments(data: bytes) -> Optional[collections.Counter]:
    try:
        toks = list(tokenize.tokenize(io.BytesIO(data).readline))
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, IndentationError):
        return None
    return collections.Counter(t.string.strip() for t in toks if t.type == tokenize.COMMENT)


def collect(paths: Iterable[str], files_from: Optional[str], all_files: bool) -> List[str]:
    out: List[str] = []
    if files_from:
        for line in Path(files_from).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for f in sorted(files):
                    if f.endswith(".py"):
                        fp = os.path.join(root, f)
                        if all_files or mentions(Path(fp).read_bytes()):
                            out.append(fp)
        else:
            out.append(p)
    seen, uniq = set(), []
    for p in out:
        if p not in seen:
            seen.add(p)
            uniq.append(p)
    return uniq


# ============================================================================ structure of an output

_SETUP = "init_process_group"


def _calls(tree, pred):
    """(call, depth, top_index): calls whose callee text satisfies ``pred``; depth counts the
    enclosing compound statements (def, class, if, for, with, try...)."""
    import ast

    out = []

    def visit(node, depth, top):
        elif_ = isinstance(node, ast.If) and len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)
        for i, child in enumerate(ast.iter_child_nodes(node)):
            t = top if top is not None else (i if isinstance(node, ast.Module) else None)
            if isinstance(child, ast.Call):
                try:
                    name = ast.unparse(child.func)
                except Exception:  # noqa: BLE001
                    name = ""
                if pred(name):
                    out.append((child, depth, t))
            compound = isinstance(child, ast.stmt) and any(isinstance(v, list) and v and isinstance(v[0], ast.stmt) for v in vars(child).values())
            if elif_ and child is node.orelse[0]:
                compound = False  # an elif is one level, as written
            visit(child, depth + 1 if compound else depth, t)

    visit(tree, 0, None)
    return out


def _is_dp(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return (last.endswith("DataParallel") and "Distributed" not in last and "Sharded" not in last) or last == "data_parallel"


def _is_ddp(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in ("DistributedDataParallel", "DDP")


def _main_guard(stmt) -> bool:
    import ast

    return isinstance(stmt, ast.If) and "__name__" in ast.unparse(stmt.test) and "__main__" in ast.unparse(stmt.test)


def _is_library(tree) -> bool:
    """No ``__main__`` guard and nothing but definitions/imports/assignments at top level."""
    import ast

    for stmt in tree.body:
        if _main_guard(stmt):
            return False
        if isinstance(stmt, (ast.For, ast.While, ast.With, ast.AsyncFor, ast.AsyncWith)):
            return False
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            return False
    return True


def structure_flags(data: bytes, output: bytes) -> List[str]:
    """Static signs that a migrated output is wrong although it compiles:

    setup-in-rank-branch   init_process_group inside an ``if ...get_rank()...`` branch
                           (the rank is queried before the process group exists);
    setup-in-library       a top-level process-group set-up added to a module with no
                           ``__main__`` guard and no top-level statements that run
                           (a library: importing it now initialises the process group);
    wrap-hoisted           a new DistributedDataParallel wrap sits two or more block levels
                           shallower than the DataParallel call it replaces (moving out of
                           one ``if`` is by design), or after the ``__main__`` guard;
    to-device-after-wrap   ``m = DistributedDataParallel(m, device_ids=...)`` followed, within
                           three statements, by ``m.to(...)``/``m.cuda()``: DDP was built on
                           a CPU module with device_ids (a ValueError on GPU machines).
    """
    import ast

    try:
        before, after = ast.parse(data), ast.parse(output)
    except (SyntaxError, ValueError):
        return []
    flags = []
    for node in ast.walk(after):
        if isinstance(node, ast.If) and "get_rank" in ast.unparse(node.test):
            inner = ast.Module(body=node.body + node.orelse, type_ignores=[])
            if _calls(inner, lambda n: n.endswith(_SETUP)):
                flags.append("setup-in-rank-branch")
                break
    top_setup_after = [c for c, d, _ in _calls(after, lambda n: n.endswith(_SETUP)) if d == 0]
    if top_setup_after and not [c for c, d, _ in _calls(before, lambda n: n.endswith(_SETUP)) if d == 0] and _is_library(before):
        flags.append("setup-in-library")
    dp = sorted(_calls(before, _is_dp), key=lambda c: c[0].lineno)
    old_ddp = collections.Counter(ast.unparse(c) for c, _, _ in _calls(before, _is_ddp))
    new_ddp = []
    for c, d, top in sorted(_calls(after, _is_ddp), key=lambda c: c[0].lineno):
        text = ast.unparse(c)
        if old_ddp[text] > 0:
            old_ddp[text] -= 1
        else:
            new_ddp.append((c, d, top))
    new_ids = {id(c) for c, _, _ in new_ddp}
    for node in ast.walk(after):
        for body in (getattr(node, "body", None), getattr(node, "orelse", None), getattr(node, "finalbody", None)):
            if not isinstance(body, list):
                continue
            for i, stmt in enumerate(body):
                if not (isinstance(stmt, ast.Assign) and id(stmt.value) in new_ids and len(stmt.targets) == 1):
                    continue
                target = ast.unparse(stmt.targets[0])
                for later in body[i + 1 : i + 4]:
                    for call in ast.walk(later):
                        if (
                            isinstance(call, ast.Call)
                            and isinstance(call.func, ast.Attribute)
                            and call.func.attr in ("to", "cuda")
                            and ast.unparse(call.func.value) == target
                        ):
                            flags.append(f"to-device-after-wrap(line {call.lineno})")
    guard_idx = [i for i, s in enumerate(after.body) if _main_guard(s)]
    for (_, d_in, _), (c, d_out, top) in zip(dp, new_ddp):
        if d_out <= d_in - 2 or (guard_idx and d_out == 0 and top is not None and top > guard_idx[0]):
            flags.append(f"wrap-hoisted(line {c.lineno}: depth {d_in}->{d_out})")
    return flags


# ============================================================================ classification

_NORMALISE = [
    (re.compile(r"\"[^\"]*\"|'[^']*'|`[^`]*`"), "<q>"),
    (re.compile(r"cannot tell whether \S+ is"), "cannot tell whether <name> is"),
    (re.compile(r"call \S+\.sampler\.set_epoch"), "call <loader>.sampler.set_epoch"),
    (re.compile(r"^\S+ (uses a batch_sampler|uses a custom sampler|reads an IterableDataset|is built before)"), r"<loader> \1"),
    (re.compile(r"no epoch loop found for \S+:"), "no epoch loop found for <loader>:"),
    (re.compile(r"\b\d+\b"), "N"),
]


def normalise(message: str) -> str:
    for rx, repl in _NORMALISE:
        message = rx.sub(repl, message)
    return message


@dataclass
class Row:
    path: str
    status: str
    lines: int = 0
    seconds: float = 0.0
    code_mentions: Optional[int] = None
    applicable: bool = False
    findings: List[Dict] = field(default_factory=list)  # the rewrite's findings
    reasons: List[str] = field(default_factory=list)  # refused: "CODE: normalised message"
    error: Optional[str] = None
    # migrated outputs
    compiles: Optional[bool] = None
    compile_error: Optional[str] = None
    idempotent: Optional[bool] = None
    second_pass: Optional[str] = None  # status of the rewrite run on the output
    residual_dp: Optional[int] = None  # NAME tokens mentioning DataParallel left in the output
    lost_comments: List[str] = field(default_factory=list)
    structure: List[str] = field(default_factory=list)  # see structure_flags
    diff_added: Optional[int] = None
    diff_removed: Optional[int] = None
    check_output: Dict[str, int] = field(default_factory=dict)
    check_output_error: Optional[str] = None
    check_input: Dict[str, int] = field(default_factory=dict)
    check_input_error: Optional[str] = None
    output_file: Optional[str] = None
    # --projects: the outcome a project migration gave this library module
    per_file_status: Optional[str] = None  # its status alone, where a project migration decided it
    project: Optional[str] = None  # the entry script whose project migration decided it
    project_at: List[str] = field(default_factory=list)  # refused: where the project's blocking findings are


def _status(out: RewriteOutcome, n_code: Optional[int], mentioned: bool) -> str:
    if out.input_error:
        return "parse-error"
    if out.blocked:
        return "refused"
    if out.changed:
        return "migrated"
    if any(sev != "info" for _, sev, _, _ in out.findings):
        return "warned-only"
    if n_code:
        return "silent"
    if mentioned:
        return "text-only"
    return "no-mention"


def survey_file(path: str, args, out_dir: Optional[str], common: str) -> Row:
    data = Path(path).read_bytes()
    row = Row(path=path, status="", lines=data.count(b"\n"))
    row.code_mentions = code_mentions(data)
    t = time.perf_counter()
    try:
        out = run_rewrite(data, path)
    except Exception as e:  # noqa: BLE001 - a crash is a finding of the survey
        row.seconds = time.perf_counter() - t
        row.status = "crash"
        row.error = f"{type(e).__name__}: {e}"
        row.findings = [{"traceback": traceback.format_exc(limit=-4)}]
        return row
    row.seconds = time.perf_counter() - t
    row.applicable = out.applicable
    row.status = _status(out, row.code_mentions, mentions(data))
    row.error = out.input_error
    row.findings = [{"code": c, "severity": s, "message": m, "line": ln} for c, s, m, ln in out.findings]
    if out.blocked:
        blocking = [f for f in out.findings if f[1] == "error"] or [f for f in out.findings if f[1] != "info"]
        row.reasons = sorted({f"{c}: {normalise(m)}" for c, _, m, _ in blocking}) or ["(blocked, no finding)"]

    if args.check_inputs and row.status not in ("parse-error",):
        try:
            diags, err = run_check(data, path, args.check_subprocess)
            row.check_input = dict(collections.Counter(c for c, _, _ in diags))
            row.check_input_error = err
        except Exception as e:  # noqa: BLE001
            row.check_input_error = f"crash {type(e).__name__}: {e}"

    if row.status != "migrated":
        return row
    check_output(row, data, out.output, args, out_dir, common)
    return row


def check_output(row: Row, data: bytes, output: bytes, args, out_dir: Optional[str], common: str, again: bool = True) -> None:
    """The checks of a migrated output (``again``: rewrite it a second time, alone)."""
    path = row.path
    row.idempotent = row.second_pass = None
    try:
        compile(output, path, "exec", dont_inherit=True)
        row.compiles = True
    except SyntaxError as e:
        row.compiles = False
        row.compile_error = f"line {e.lineno}: {e.msg}"
    if again:
        try:
            second = run_rewrite(output, path)
            row.idempotent = not second.changed
            row.second_pass = _status(second, code_mentions(output), mentions(output))
        except Exception as e:  # noqa: BLE001
            row.idempotent = False
            row.second_pass = f"crash {type(e).__name__}: {e}"
    row.residual_dp = code_mentions(output)
    before, after = comments(data), comments(output)
    if before is not None and after is not None:
        row.lost_comments = sorted((before - after).elements())[:20]
    row.structure = structure_flags(data, output)
    a = data.decode("utf-8", "replace").splitlines()
    b = output.decode("utf-8", "replace").splitlines()
    added = removed = 0
    for line in difflib.unified_diff(a, b, lineterm="", n=0):
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    row.diff_added, row.diff_removed = added, removed
    try:
        diags, err = run_check(output, path, args.check_subprocess)
        row.check_output = dict(collections.Counter(c for c, _, _ in diags))
        row.check_output_error = err
    except Exception as e:  # noqa: BLE001
        row.check_output_error = f"crash {type(e).__name__}: {e}"
    if out_dir:
        rel = os.path.relpath(os.path.abspath(path), common) if common else os.path.basename(path)
        dest = Path(out_dir) / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(output)
        row.output_file = str(dest)


# ============================================================================ projects


def _runs(tree) -> bool:
    """The module runs something when executed (an entry script): a ``__main__`` guard, or
    module-level loops, ``with`` blocks or calls (the survey's own reading, no dp2ddp)."""
    return not _is_library(tree)


def entry_scripts(repo: str) -> List[str]:
    """The entry scripts of a repository folder, in path order."""
    import ast

    out = []
    for root, dirs, files in os.walk(repo):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__")
        for f in sorted(files):
            if not f.endswith(".py") or f.endswith("_ddp.py"):
                continue
            fp = os.path.join(root, f)
            try:
                tree = ast.parse(Path(fp).read_bytes())
            except (SyntaxError, ValueError):
                continue
            if _runs(tree):
                out.append(fp)
    return out


def repositories(paths: Iterable[str]) -> List[str]:
    """Every folder directly under each directory PATH: one repository each."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            out.extend(os.path.join(p, d) for d in sorted(os.listdir(p)) if not d.startswith(".") and os.path.isdir(os.path.join(p, d)))
    return out


@dataclass
class ProjectRow:
    entry: str
    status: str  # migrated | refused | crash
    helpers: List[str] = field(default_factory=list)  # real paths of the helpers it plans
    reasons: List[str] = field(default_factory=list)  # refused: "CODE: normalised message"
    at: List[str] = field(default_factory=list)  # refused: "file:line" of each blocking finding
    error: Optional[str] = None


def _blocking(files: List[ProjectFile]) -> List[Tuple[str, str, str]]:
    """(code, message, file:line) of a blocked project's blocking findings."""
    out = []
    for f in files:
        errs = [x for x in f.findings if x[1] == "error"] or ([x for x in f.findings if x[1] != "info"] if f.blocked else [])
        out.extend((c, msg, f"{f.path}:{ln}") for c, _, msg, ln in errs)
    return out


def survey_projects(paths: Iterable[str], rows: List[Row], args, out_dir: Optional[str], common: str) -> List[ProjectRow]:
    """Project migrations of every entry script of every repository under ``paths``; the
    surveyed library modules they plan as helpers take their outcome (see the docstring)."""
    import ast

    by_path = {os.path.realpath(r.path): r for r in rows}
    library = {}
    for real, r in by_path.items():
        try:
            library[real] = not _runs(ast.parse(Path(real).read_bytes()))
        except (SyntaxError, ValueError, OSError):
            library[real] = False
    projects: List[ProjectRow] = []
    edits: Dict[str, List[Tuple[ProjectRow, ProjectFile]]] = collections.defaultdict(list)
    for repo in repositories(paths):
        for entry in entry_scripts(repo):
            try:
                out = run_project(entry)
            except Exception as e:  # noqa: BLE001 - a crash is a finding of the survey
                projects.append(ProjectRow(entry, "crash", error=f"{type(e).__name__}: {e}"))
                continue
            if out is None:
                continue
            if out.input_error:
                projects.append(ProjectRow(entry, "refused", reasons=[f"input: {out.input_error}"]))
                continue
            helpers = [f for f in out.files if f.role == "helper"]
            pr = ProjectRow(entry, "refused" if out.blocked else "migrated", [f.path for f in helpers])
            if out.blocked:
                found = _blocking(out.files) or [("(blocked, no finding)", "", entry)]
                pr.reasons = sorted({f"{c}: {normalise(m)}" if m else c for c, m, _ in found})
                pr.at = sorted({_rel(at, common) for _, _, at in found})
            projects.append(pr)
            mine = next((f for f in out.files if f.role == "entry"), None)
            row = by_path.get(os.path.realpath(entry))
            if not out.blocked and mine is not None and mine.changed and row is not None and row.status == "refused":
                # refused alone only for want of its helpers (DDP166: migrate with --with-helpers):
                # the project migration the message asks for is what a user runs
                row.per_file_status, row.status, row.project, row.reasons = row.status, "migrated", _rel(entry, common), []
                check_output(row, Path(mine.path).read_bytes(), mine.output, args, out_dir, common, again=False)
            for f in helpers:
                if f.path in by_path and library.get(f.path):
                    edits[f.path].append((pr, f))
    for real, got in edits.items():
        row = by_path[real]
        migrated = [(pr, f) for pr, f in got if pr.status == "migrated" and f.changed]
        refused = [pr for pr, _ in got if pr.status == "refused"]
        if not migrated and (not refused or len(refused) < len(got)):
            continue  # no project migration edits it, and not every one that reaches it refuses
        row.per_file_status = row.status
        if migrated:
            pr, f = migrated[0]
            row.status, row.project, row.reasons = "migrated", _rel(pr.entry, common), []
            check_output(row, Path(real).read_bytes(), f.output, args, out_dir, common, again=False)
        else:
            pr = refused[0]
            row.status, row.project = "refused", _rel(pr.entry, common)
            row.reasons, row.project_at = list(pr.reasons), list(pr.at)
    return projects


# ============================================================================ report

STATUSES = ["migrated", "refused", "warned-only", "silent", "text-only", "no-mention", "parse-error", "crash"]


def summarise(rows: List[Row], projects: Optional[List[ProjectRow]] = None) -> Dict:
    status = collections.Counter(r.status for r in rows)
    reasons = collections.Counter(reason for r in rows if r.status == "refused" for reason in r.reasons)
    warn_codes = collections.Counter(
        f["code"] for r in rows if r.status in ("migrated", "warned-only") for f in r.findings if f.get("severity") == "warning"
    )
    warn_messages = collections.Counter(
        f"{f['code']}: {normalise(f['message'])}"
        for r in rows
        if r.status in ("migrated", "warned-only")
        for f in r.findings
        if f.get("severity") == "warning"
    )
    migrated = [r for r in rows if r.status == "migrated"]
    check_out = collections.Counter()
    check_out_files = collections.Counter()
    for r in migrated:
        for c, n in r.check_output.items():
            check_out[c] += n
            check_out_files[c] += 1
    check_in_files = collections.Counter(c for r in rows for c in r.check_input)
    disagreements = [r.path for r in rows if r.status in ("silent", "text-only", "no-mention") and "DDP001" in r.check_input]
    return {
        "files": len(rows),
        "lines": sum(r.lines for r in rows),
        "seconds": round(sum(r.seconds for r in rows), 3),
        "status": {s: status.get(s, 0) for s in STATUSES},
        "refused_reasons": dict(reasons.most_common()),
        "warnings_on_migrated_or_warned": dict(warn_codes.most_common()),
        "warning_messages": dict(warn_messages.most_common()),
        "migrated_checks": {
            "compiles": sum(1 for r in migrated if r.compiles),
            "does_not_compile": [r.path for r in migrated if r.compiles is False],
            "idempotent": sum(1 for r in migrated if r.idempotent),
            "not_rewritten_again": sum(1 for r in migrated if r.idempotent is None),
            "not_idempotent": [r.path for r in migrated if r.idempotent is False],
            "residual_dataparallel": [r.path for r in migrated if r.residual_dp],
            "lost_comments": [r.path for r in migrated if r.lost_comments],
            "structure": {r.path: r.structure for r in migrated if r.structure},
        },
        "check_on_migrated_findings": dict(check_out.most_common()),
        "check_on_migrated_files": dict(check_out_files.most_common()),
        "check_errors_on_migrated": [r.path for r in migrated if r.check_output_error],
        "check_on_inputs_files": dict(check_in_files.most_common()),
        "check_ddp001_but_rewrite_silent": disagreements,
        **(_project_summary(rows, projects) if projects is not None else {}),
    }


def _project_summary(rows: List[Row], projects: List[ProjectRow]) -> Dict:
    alone = collections.Counter(r.per_file_status or r.status for r in rows)
    moved = collections.Counter(f"{r.per_file_status} -> {r.status}" for r in rows if r.per_file_status)
    return {
        "per_file_status": {s: alone.get(s, 0) for s in STATUSES},
        "project_attributions": dict(moved.most_common()),
        "projects": [asdict(p) for p in projects],
        "project_status": dict(collections.Counter(p.status for p in projects).most_common()),
    }


def table(summary: Dict, rows: List[Row], common: str) -> str:
    out = io.StringIO()
    w = out.write
    w(f"dp2ddp rewrite survey: {summary['files']} files, {summary['lines']} lines, {summary['seconds']:.1f} s in the rewrite\n\n")
    if "per_file_status" in summary:
        w("status (each file alone | library modules decided by their entry's project migration)\n")
        for s, n in summary["status"].items():
            w(f"  {s:<12} {summary['per_file_status'][s]:5d} | {n:5d}\n")
        w("  library modules moved by a project migration: "
          + (", ".join(f"{k} {n}" for k, n in summary["project_attributions"].items()) or "none") + "\n")
        w(f"\nproject migrations (rewrite ENTRY --with-helpers): {len(summary['projects'])} entries with helpers that use "
          f"DataParallel; " + ", ".join(f"{k} {n}" for k, n in summary["project_status"].items()) + "\n")
        for p in summary["projects"]:
            helpers = ", ".join(_rel(h, common) for h in p["helpers"]) or "no helper"
            why = ""
            if p["status"] == "refused":
                why = f" at {', '.join(p['at'])}: {'; '.join(p['reasons'])}"
            elif p["status"] == "crash":
                why = f": {p['error']}"
            w(f"  {p['status']:<9} {_rel(p['entry'], common)} [{helpers}]{why}\n")
        w("\n")
    else:
        w("status\n")
        for s, n in summary["status"].items():
            w(f"  {s:<12} {n:5d}\n")
    if summary["refused_reasons"]:
        w("\nrefused, by reason (files)\n")
        for reason, n in summary["refused_reasons"].items():
            w(f"  {n:4d}  {reason}\n")
    if summary["warnings_on_migrated_or_warned"]:
        w("\nrewrite warnings on migrated / warned-only files (findings)\n")
        for c, n in summary["warnings_on_migrated_or_warned"].items():
            w(f"  {c:<8} {n:5d}\n")
        w("  by message:\n")
        for m, n in summary["warning_messages"].items():
            w(f"  {n:4d}  {m}\n")
    mc = summary["migrated_checks"]
    n_mig = summary["status"]["migrated"]
    w(f"\nmigrated outputs: {mc['compiles']}/{n_mig} compile, {mc['idempotent']}/{n_mig - mc['not_rewritten_again']} idempotent"
      + (f" ({mc['not_rewritten_again']} project helpers not rewritten again)" if mc["not_rewritten_again"] else "") + ", "
      f"{len(mc['residual_dataparallel'])} with DataParallel left in code, {len(mc['lost_comments'])} with lost comments, "
      f"{len(mc['structure'])} with structural flags\n")
    for key in ("does_not_compile", "not_idempotent", "residual_dataparallel", "lost_comments"):
        for p in mc[key]:
            w(f"  {key}: {_rel(p, common)}\n")
    for p, flags in mc["structure"].items():
        w(f"  structure: {_rel(p, common)}: {', '.join(flags)}\n")
    if summary["check_on_migrated_findings"]:
        w("\ndp2ddp check (default rules) on migrated outputs: findings (files)\n")
        for c, n in summary["check_on_migrated_findings"].items():
            w(f"  {c:<8} {n:5d}  ({summary['check_on_migrated_files'][c]})\n")
    for p in summary["check_errors_on_migrated"]:
        w(f"  check error on {_rel(p, common)}\n")
    if summary["check_on_inputs_files"]:
        w("\ndp2ddp check (default rules) on the inputs: files with a finding, by code\n")
        for c, n in summary["check_on_inputs_files"].items():
            w(f"  {c:<8} {n:5d}\n")
    if summary["check_ddp001_but_rewrite_silent"]:
        w("\ncheck reports DDP001 but the rewrite did nothing\n")
        for p in summary["check_ddp001_but_rewrite_silent"]:
            w(f"  {_rel(p, common)}\n")
    w("\nper file\n")
    for r in rows:
        extra = ""
        if r.status == "refused":
            extra = "; ".join(r.reasons)
        elif r.status == "migrated":
            flags = []
            if r.compiles is False:
                flags.append(f"NO COMPILE ({r.compile_error})")
            if r.idempotent is False:
                flags.append(f"not idempotent ({r.second_pass})")
            if r.residual_dp:
                flags.append(f"{r.residual_dp} DP names left")
            if r.lost_comments:
                flags.append(f"{len(r.lost_comments)} comments lost")
            flags.extend(r.structure)
            warns = collections.Counter(f["code"] for f in r.findings if f.get("severity") == "warning")
            flags.append(f"+{r.diff_added}/-{r.diff_removed}")
            if warns:
                flags.append("warn " + ",".join(f"{c}x{n}" for c, n in sorted(warns.items())))
            if r.check_output:
                flags.append("check " + ",".join(f"{c}x{n}" for c, n in sorted(r.check_output.items())))
            extra = "; ".join(flags)
        elif r.status == "warned-only":
            extra = "; ".join(sorted({f"{f['code']}: {normalise(f['message'])}" for f in r.findings if f.get("severity") != "info"}))
        elif r.status in ("parse-error", "crash"):
            extra = (r.error or "")[:160]
        elif r.status == "silent":
            extra = f"{r.code_mentions} code mentions" + (f"; check {','.join(sorted(r.check_input))}" if r.check_input else "")
        if r.project:
            extra = (f"[project of {r.project}" + (f", at {', '.join(r.project_at)}" if r.project_at else "")
                     + f"; alone: {r.per_file_status}] " + extra)
        w(f"  {r.status:<11} {_rel(r.path, common)}  {extra}\n")
    return out.getvalue()


def revision() -> Dict:
    """Which dp2ddp the survey measured: the imported package, its git revision, and
    whether its working tree differs from that revision (other engineers edit it)."""
    import dp2ddp

    root = str(Path(dp2ddp.__file__).resolve().parent.parent)
    info: Dict = {"package": str(Path(dp2ddp.__file__).resolve().parent), "revision": None, "dirty": None}
    try:
        rev = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            info["revision"] = rev.stdout.strip()
            st = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "dp2ddp"], capture_output=True, text=True, timeout=10)
            info["dirty"] = bool(st.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def _rel(path: str, common: str) -> str:
    return os.path.relpath(os.path.abspath(path), common) if common else path


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="files or directories")
    ap.add_argument("--files-from", help="a file listing paths, one a line")
    ap.add_argument("--all-files", action="store_true", help="survey every .py file of the directories, not only those that mention DataParallel")
    ap.add_argument("--json", dest="json_path", help="write the summary and per-file rows here")
    ap.add_argument("--write-outputs", metavar="DIR", help="keep each migrated output under DIR (same relative layout)")
    ap.add_argument("--check-subprocess", action="store_true", help="run `dp2ddp check --format json` in a subprocess instead of in process")
    ap.add_argument("--no-check-inputs", dest="check_inputs", action="store_false", help="do not run check on the inputs")
    ap.add_argument("-q", "--quiet", action="store_true", help="print the summary only, no per-file lines")
    ap.add_argument("--label", help="free text recorded in the report (e.g. which branch or export was measured)")
    ap.add_argument("--projects", action="store_true", help="also migrate the entry scripts of every repository folder under "
                    "PATH with their helpers, and count each library module they plan with its entry's outcome")
    args = ap.parse_args(argv)
    files = collect(args.paths, args.files_from, args.all_files)
    if not files:
        ap.error("no files to survey")
    common = os.path.commonpath([os.path.abspath(f) for f in files])
    if os.path.isfile(common):
        common = os.path.dirname(common)
    rows = []
    for f in files:
        rows.append(survey_file(f, args, args.write_outputs, common))
    projects = survey_projects(args.paths, rows, args, args.write_outputs, common) if args.projects else None
    summary = summarise(rows, projects)
    rev = revision()
    if args.label:
        rev["label"] = args.label
    text = table(summary, rows, common)
    text = (
        f"dp2ddp {rev['package']} at {rev['revision'] or 'unknown revision'}"
        + (" (working tree modified)" if rev["dirty"] else "")
        + (f" [{args.label}]" if args.label else "")
        + "\n"
        + text
    )
    if args.quiet:
        text = text.split("\nper file\n")[0] + "\n"
    sys.stdout.write(text)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"dp2ddp": rev, "summary": summary, "root": common, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
