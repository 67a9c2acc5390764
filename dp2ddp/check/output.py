"""Printing `dp2ddp check` results: text, JSON, SARIF 2.1.0 and GitHub annotations."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Dict, List, Sequence

import click

from dp2ddp.check.results import Diagnostic, FileResult
from dp2ddp.registry import BY_CODE, CODES, MIGRATION_FIX, Code


def offered(d: Diagnostic) -> bool:
    """Whether ``[*]`` marks ``d``: `--fix` applies the rule's own fix. DDP001's fix is the
    whole migration, which may still refuse the file (DDP101, DDP104, ...) once it runs:
    that is said once in the summary, never promised per finding."""
    return d.fixable and d.code != MIGRATION_FIX


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def text(results: Sequence[FileResult], color: bool, quiet: bool = False, new_only: bool = False) -> str:
    out: List[str] = []
    diags = [d for r in results for d in r.diagnostics]
    errors = [r.error for r in results if r.error]
    for e in errors:
        out.append(click.style(e, fg="red", bold=True) if color else e)
    for d in sorted(diags, key=lambda d: (d.path, d.line, d.col, d.code)):
        loc = f"{d.path}:{d.line}:{d.col}:"
        code = d.code
        fix = " [*]" if offered(d) else ""
        if color:
            loc = click.style(d.path, bold=True) + click.style(f":{d.line}:{d.col}:", fg="cyan")
            code = click.style(d.code, fg="red" if d.severity != "info" else "blue", bold=True)
            fix = click.style(fix, fg="cyan") if fix else ""
        out.append(f"{loc} {code}{fix} {d.message}")
    if quiet:
        return "\n".join(out) + ("\n" if out else "")
    fixed = sum(r.fixed for r in results)
    hidden = sum(r.hidden for r in results)
    fixable = sum(1 for d in diags if offered(d))
    migrations = len({d.path for d in diags if d.fixable and d.code == MIGRATION_FIX})
    summary: List[str] = []
    if diags or fixed:
        if fixed:
            summary.append(f"Found {_plural(len(diags) + fixed, 'error')} ({fixed} fixed, {len(diags)} remaining).")
        else:
            summary.append(f"Found {_plural(len(diags), 'error')}.")
        if fixable:
            summary.append(f"[*] {fixable} fixable with the `--fix` option.")
        if migrations:
            summary.append(
                f"{_plural(migrations, 'file')} with DataParallel: `--fix` migrates each to DDP or says why it "
                "cannot (`dp2ddp rewrite --diff` shows the change first)."
            )
    elif not errors:
        summary.append("All checks passed!")
    if hidden:
        summary.append(
            f"{_plural(hidden, 'more finding')} on unchanged lines not shown (--new-only); "
            "run without --new-only to see them."
        )
    if summary and out:
        out.append("")
    out.extend(summary)
    return "\n".join(out) + "\n"


def statistics(results: Sequence[FileResult]) -> str:
    counts = Counter(d.code for r in results for d in r.diagnostics)
    fixable = {d.code for r in results for d in r.diagnostics if offered(d)}
    lines = []
    for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        entry = BY_CODE.get(code)
        mark = "[*]" if code in fixable else "[ ]"
        lines.append(f"{n:>5}\t{code}\t{mark} {entry.name if entry else ''}")
    errors = sum(1 for r in results if r.error)
    if errors:
        lines.append(f"{errors:>5}\t\t    files with errors")
    return "\n".join(lines) + ("\n" if lines else "")


def _diag_json(d: Diagnostic) -> Dict:
    return {
        "code": d.code,
        "name": d.name,
        "message": d.message,
        "severity": d.severity,
        "filename": d.path,
        "location": {"row": d.line, "column": d.col},
        "end_location": {"row": d.end_line, "column": d.end_col},
        "fix": _fix_json(d),
    }


def _fix_json(d: Diagnostic):
    if not d.fixable:
        return None
    if not offered(d):  # the migration: it may refuse the file when it runs
        return {"available": True, "message": "run `dp2ddp check --fix`: the DDP migration, which may refuse the file and say why"}
    return {"available": True, "message": "run `dp2ddp check --fix`"}


def as_json(results: Sequence[FileResult]) -> str:
    items = []
    for r in results:
        if r.error:
            items.append(
                {
                    "code": None,
                    "name": "error",
                    "message": r.error,
                    "severity": "error",
                    "filename": r.path,
                    "location": None,
                    "end_location": None,
                    "fix": None,
                }
            )
        items.extend(_diag_json(d) for d in r.diagnostics)
    items.sort(key=lambda i: (i["filename"], (i["location"] or {}).get("row", 0), (i["location"] or {}).get("column", 0)))
    return json.dumps(items, indent=2) + "\n"


def _uri(path: str) -> str:
    rel = os.path.relpath(path) if os.path.isabs(path) else path
    return rel.replace(os.sep, "/")


def _level(severity: str) -> str:
    return {"info": "note", "error": "error"}.get(severity, "warning")


def _rule_sarif(code: Code) -> Dict:
    return {
        "id": code.code,
        "name": code.name,
        "shortDescription": {"text": code.message.replace("{what}", "…").replace("{n}", "…")},
        "fullDescription": {"text": code.what},
        "help": {"text": f"{code.why}\n\n{code.fix}", "markdown": f"{code.why}\n\n**Fix:** {code.fix}"},
        "defaultConfiguration": {"level": _level(code.severity)},
        "properties": {"tags": ["ddp"] if code.kind == "rule" else ["ddp", "migration"], "default": code.default, "fixable": code.fixable},
    }


def sarif(results: Sequence[FileResult]) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        ver = version("dp2ddp")
    except PackageNotFoundError:  # pragma: no cover
        ver = "0"
    index = {c.code: i for i, c in enumerate(CODES)}
    sarif_results = []
    for r in results:
        for d in r.diagnostics:
            sarif_results.append(
                {
                    "ruleId": d.code,
                    "ruleIndex": index[d.code],
                    "level": _level(d.severity),
                    "message": {"text": d.message},
                    "locations": [
                        {
                            "physicalLocation": {
                                "artifactLocation": {"uri": _uri(d.path)},
                                "region": {
                                    "startLine": d.line,
                                    "startColumn": d.col,
                                    "endLine": d.end_line,
                                    "endColumn": d.end_col,
                                },
                            }
                        }
                    ],
                }
            )
    notifications = [
        {"level": "error", "message": {"text": r.error}, "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(r.path)}}}]}
        for r in results
        if r.error
    ]
    run = {
        "tool": {
            "driver": {
                "name": "dp2ddp",
                "version": ver,
                "informationUri": "https://github.com/dp2ddp/dp2ddp",
                "rules": [_rule_sarif(c) for c in CODES],
            }
        },
        "results": sarif_results,
        "invocations": [{"executionSuccessful": not notifications, "toolExecutionNotifications": notifications}],
    }
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [run],
    }
    return json.dumps(doc, indent=2) + "\n"


def _gh_escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_escape_prop(s: str) -> str:
    return _gh_escape_data(s).replace(":", "%3A").replace(",", "%2C")


def github(results: Sequence[FileResult]) -> str:
    lines = []
    for r in results:
        if r.error:
            lines.append(f"::error file={_gh_escape_prop(r.path)},title=dp2ddp::{_gh_escape_data(r.error)}")
    for d in sorted((d for r in results for d in r.diagnostics), key=lambda d: (d.path, d.line, d.col)):
        level = {"info": "notice", "error": "error"}.get(d.severity, "warning")
        props = (
            f"file={_gh_escape_prop(d.path)},line={d.line},col={d.col},endLine={d.end_line},"
            f"endColumn={d.end_col},title={_gh_escape_prop(f'dp2ddp ({d.code})')}"
        )
        lines.append(f"::{level} {props}::{_gh_escape_data(f'{d.path}:{d.line}:{d.col}: {d.code} {d.message}')}")
    return "\n".join(lines) + ("\n" if lines else "")
