"""The DDP wrap moved below the statements that still place or initialise the module
(where it goes is a fact: :func:`dp2ddp.model.wrap_placement.absorb_placement`): :class:`Hoist`
holds what travels with a moved wrap, :func:`unwrap_in_place` / :func:`drop_emptied_if`
take it from where it was, :func:`insert_hoisted` writes it; :func:`placed_late` refuses a
placement that comes after the point where every rank must wrap."""

from __future__ import annotations

import ast
from typing import List, Optional

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, InsertAfter, Remove, Replace
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.wrap_placement import late_placements
from dp2ddp.model.wraps import Wrap


class Hoist:
    """A DDP wrap moved below ``anchor``: what travels with it (the comments of the lines it
    left, a later ``.cuda()`` it does first, the script's subclass it calls)."""

    def __init__(self, anchor: ast.stmt, target: ast.AST) -> None:
        self.anchor = anchor
        self.target = target
        self.leading: List[cst.EmptyLine] = []
        self.comment: Optional[cst.TrailingWhitespace] = None
        self.guarded = False
        self.late_cuda: Optional[ast.stmt] = None  # a later ``t.cuda()`` the wrap does first
        self.place = False  # the module is on no GPU before the wrap: DataParallel placed it (wrap_placement.placed_by_dataparallel)
        self.cls: Optional[str] = None  # the script's DataParallel subclass the wrap made
        self.sync_bn = False  # the original synchronised BatchNorm across the GPUs (model/sync_bn.py)
        self.kept_under: Optional[ast.expr] = None  # the test the module exists under (model/bound.py): the wrap stays under it


def hoist_at(hoists, anchor: ast.stmt, target: ast.AST) -> Hoist:
    """The one :class:`Hoist` of ``target`` below ``anchor`` (two wraps of one model that
    move to one place are written once)."""
    key = (id(anchor), ast.unparse(target))
    if key not in hoists:
        hoists[key] = Hoist(anchor, target)
    return hoists[key]


def unwrap_in_place(ctx: Context, w: Wrap, inner_text: str, hoist: Hoist) -> list:
    """Replace the wrap by the bare module; drop the statement if it became ``x = x``."""
    m = ctx.m
    if w.target is not None and inner_text == m.source(w.target):
        line = ctx.bridge.statement(w.stmt)
        if isinstance(line, cst.SimpleStatementLine):
            hoist.leading.extend(line.leading_lines)
            if line.trailing_whitespace.comment is not None and hoist.comment is None:
                hoist.comment = line.trailing_whitespace
            return [Remove(line)]
    return [Replace(ctx.cst(w.outer), ctx.expr(inner_text))]


def drop_emptied_if(ctx: Context, w: Wrap, hoist: Hoist) -> Optional[list]:
    """``if cond:`` whose only statement was the wrap (and no ``else``) goes away whole;
    its comments travel with the hoisted wrap."""
    m = ctx.m
    owner = m.parent(w.stmt)
    if not isinstance(owner, ast.If) or owner.orelse or len(owner.body) != 1 or owner.body[0] is not w.stmt:
        return None
    if m.block_of(owner) is None:
        return None
    node = ctx.bridge.statement(owner)
    hoist.leading[:0] = list(getattr(node, "leading_lines", ()))
    return [Remove(node)]


def insert_hoisted(ctx: Context, hoist: Hoist, find_unused: bool) -> Finding:
    """Write the moved wrap, ``t = DistributedDataParallel(t, ...)``, after its anchor."""
    m = ctx.m
    t = m.source(hoist.target)
    stmt = inner = ctx.stmt("{t} = {call}", t=t, call=ctx.ddp_call(cuda_first(ctx, t) if hoist.late_cuda is not None or hoist.place else t,
                                                                   find_unused, hoist.cls, hoist.sync_bn))
    if hoist.comment is not None:
        stmt = stmt.with_changes(trailing_whitespace=hoist.comment)
    if hoist.kept_under is not None:
        stmt = ctx.stmt("if {test}:\n    pass", test=m.source(hoist.kept_under))
        stmt = stmt.with_changes(body=stmt.body.with_changes(body=[inner]))  # type: ignore[attr-defined]
    if hoist.leading:
        stmt = stmt.with_changes(leading_lines=hoist.leading)
    return ctx.note(hoist.anchor, "DDP100", f"wrap {t} in DistributedDataParallel here", [InsertAfter(ctx.bridge.statement(hoist.anchor), (stmt,))])


def cuda_first(ctx: Context, module_text: str) -> str:
    """The module placed on the current GPU as it is wrapped (see :func:`~dp2ddp.model.wrap_placement.late_cuda`)."""
    torch = ctx.name("torch")
    return f"{module_text}.cuda() if {torch}.cuda.is_available() else {module_text}"


def placed_at_wrap(ctx: Context, module_text: str, module: Optional[ast.AST]) -> str:
    """The module placed on the current GPU as DataParallel placed it at the wrap
    (:func:`~dp2ddp.model.wrap_placement.placed_by_dataparallel`): a name as :func:`cuda_first`
    writes it; any other expression (``Net()``, evaluated once) through ``.to``."""
    if isinstance(module, (ast.Name, ast.Attribute)):
        return cuda_first(ctx, module_text)
    torch = ctx.name("torch")
    return f'{module_text}.to({torch}.cuda.current_device() if {torch}.cuda.is_available() else "cpu")'


def early_note(m: SemanticModel, early: Optional[ast.stmt]) -> str:
    """What a finding adds when the wrap places the module first (``early``: the later
    ``.cuda()`` that then moves nothing)."""
    if early is None:
        return ""
    return (f"; the module is placed on this rank's GPU at the wrap (line {early.lineno}'s `{m.source(early).strip()[:40]}` "
            "then moves nothing): DistributedDataParallel needs its parameters there when it is built")


def placed_late(ctx: Context, w: Wrap, anchor: ast.stmt, target: ast.AST) -> Optional[Finding]:
    """The module is placed on its device after the point where the DDP wrap would be
    (``DistributedDataParallel(net, device_ids=[d])`` then meets parameters still on the CPU:
    a migration that runs on CPU and fails on the first GPU)."""
    m = ctx.m
    late = late_placements(m, anchor, target, w.module)
    if not late:
        return None
    line = m.position(late[0])[0]
    return ctx.block(w.call, "DDP101", f"`{m.source(late[0]).strip()[:50]}` (line {line}) places the model on its device after the "
                     "point where every rank must wrap it: DistributedDataParallel needs its parameters on the device when it is "
                     "built; place the model before the wrap, then migrate")
