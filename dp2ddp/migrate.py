"""The DataParallel -> DistributedDataParallel migration: plan it, apply it.

``plan_migration`` runs every transform of :mod:`dp2ddp.codemods` over one analysed
module. Each transform *proposes* findings (notes about what changes, warnings about
what does not); the edits of all of them form one :class:`~dp2ddp.engine.Fix` that the
shared engine applies. `rewrite`, `check --fix` (rule DDP001) and the hooks all go
through here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional

import libcst as cst

from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding, Fix, apply_edits, locate
from dp2ddp.source import Source, parse

# A finding with one of these severities stops the whole file from being migrated:
# a half-migrated script (DDP set-up but a DataParallel wrap left behind) is worse
# than the original.
BLOCKING = "error"


@dataclass
class Options:
    keep_batch_size: bool = False  # keep batch_size/num_workers per process instead of dividing
    print_all_ranks: bool = False  # do not restrict print() to rank 0


@dataclass
class Migration:
    findings: List[Finding] = field(default_factory=list)
    fix: Optional[Fix] = None
    blocked: bool = False
    applicable: bool = False  # the file uses DataParallel at all

    @property
    def notes(self) -> List[Finding]:
        return [f for f in self.findings if f.severity == "info"]

    @property
    def warnings(self) -> List[Finding]:
        return [f for f in self.findings if f.severity != "info"]


@dataclass
class Result:
    path: str
    output: bytes
    changed: bool
    migration: Migration


_DP_BYTES = re.compile(rb"(?<!Distributed)DataParallel")


def quick_reject(data: bytes) -> bool:
    """True when the file cannot possibly use DataParallel (byte-level pre-filter).

    ``DistributedDataParallel`` alone does not count, so migrated files are not analysed
    again; an ``import ... DataParallel`` or any other spelling still is."""
    return _DP_BYTES.search(data) is None


def plan_migration(an: Analysis, options: Optional[Options] = None) -> Migration:
    from dp2ddp.codemods import TRANSFORMS
    from dp2ddp.codemods.context import MigrationContext

    options = options or Options()
    ctx = MigrationContext(an, options)
    if not ctx.applicable:
        return Migration()
    findings: List[Finding] = list(ctx.findings)
    if not ctx.blocked:
        for transform in TRANSFORMS:
            findings.extend(transform(ctx))
    findings = locate(an.wrapper, findings)
    blocked = ctx.blocked or any(f.severity == BLOCKING for f in findings)
    fix = None
    if not blocked:
        edits = [e for f in findings if f.fix for e in f.fix.edits] + list(ctx.extra_edits)
        fix = Fix(edits=edits, description="migrate DataParallel to DistributedDataParallel")
        for f in findings:
            if f.fix is not None:
                f.fix = fix
    if blocked:
        for f in findings:
            f.fix = None
        findings = [f for f in findings if f.severity != "info"]
    return Migration(findings=findings, fix=fix, blocked=blocked, applicable=True)


# What any transform looks at. A module-level function or class whose source has none of
# these (and calls no function that is kept) cannot take part in the migration; it is
# replaced by a stub while the module is analysed, which is what makes LibCST's scope
# analysis affordable on large scripts, and put back untouched afterwards.
_RELEVANT = re.compile(
    r"DataParallel|[Dd]istributed|init_process_group|spawn|DataLoader|Dataset|[Ss]ampler|[Ll]oader"
    r"|save|print|mkdir|makedirs|copy|cuda|CUDA|gpu|device|environ|isinstance|issubclass|parameters"
    r"|epoch|\bfor\b[^\n]*\bin\s+(?!range\()"
)


def _prune(module: cst.Module):
    """``(pruned_module, {stub: original}, line_shift)`` — see ``_RELEVANT``."""
    texts = {}
    for stmt in module.body:
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            texts[stmt] = module.code_for_node(stmt)
    keep = {stmt for stmt, text in texts.items() if _RELEVANT.search(text)}
    changed = True
    while changed:  # keep callers of kept functions, so call graphs stay whole
        changed = False
        kept_names = [s.name.value for s in keep]
        pattern = re.compile(r"\b(?:%s)\s*\(" % "|".join(map(re.escape, kept_names))) if kept_names else None
        for stmt, text in texts.items():
            if stmt not in keep and pattern is not None and pattern.search(text):
                keep.add(stmt)
                changed = True
    stubs = {}
    body = []
    for stmt in module.body:
        if stmt in texts and stmt not in keep:
            stub = stmt.with_changes(body=cst.IndentedBlock([cst.SimpleStatementLine([cst.Expr(cst.Ellipsis())])]))
            stubs[stub] = stmt
            body.append(stub)
        else:
            body.append(stmt)
    if not stubs:
        return module, {}, None
    pruned = module.with_changes(body=body)
    return pruned, stubs, _line_shift(module, pruned, stubs, texts)


def _line_shift(module, pruned, stubs, texts):
    """Lines a stub hides, per top-level statement of the pruned module that follows it."""
    shift, acc = {}, 0
    for stmt in pruned.body:
        shift[stmt] = acc
        if stmt in stubs:
            acc += texts[stubs[stmt]].count("\n") - pruned.code_for_node(stmt).count("\n")
    return shift


def migrate_module(module: cst.Module, path: str = "<string>", options: Optional[Options] = None):
    """Return ``(new_module, migration)``; ``new_module is module`` when nothing changed."""
    pruned, stubs, shift = _prune(module)
    an = Analysis.from_module(pruned, path)
    migration = plan_migration(an, options)
    if shift:
        for f in migration.findings:
            top = f.node
            while top is not None and an.parent(top) is not pruned:
                top = an.parent(top)
            f.line += shift.get(top, 0)
    if migration.fix:
        def restore(tree: cst.Module) -> cst.Module:
            # by identity, before the import visitors (which copy the tree) run
            return tree.with_changes(body=[stubs.get(s, s) for s in tree.body]) if stubs else tree

        return apply_edits(an.wrapper, migration.fix.edits, an.ancestors, before_imports=restore), migration
    return module, migration


def migrate_bytes(data: bytes, path: str = "<stdin>", options: Optional[Options] = None) -> Result:
    """Migrate one file's bytes. Raises :class:`dp2ddp.source.InputError` on bad input
    (the file is always parsed, so a syntax error is reported even without DataParallel)."""
    module = parse(Source(path, data))
    if quick_reject(data):
        return Result(path, data, False, Migration())
    new, migration = migrate_module(module, path, options)
    out = new.bytes if new is not module else data
    return Result(path, out, out != data, migration)


def migrate_file(path: str, options: Optional[Options] = None) -> Result:
    from dp2ddp.source import read_source

    src = read_source(path)
    return migrate_bytes(src.data, src.display, options)
