"""A mixed script's ``--local_rank`` flag reads torchrun's ``LOCAL_RANK`` by default.

``torch.distributed.launch`` passed ``--local_rank=N`` to every process; ``torchrun`` sets
the ``LOCAL_RANK`` environment variable instead. A script with a distributed path of its
own (:mod:`dp2ddp.codemods.mixed`) switches it on and picks its device from the flag: its
default becomes ``int(os.environ.get("LOCAL_RANK", <default>))``, so a launcher that passes
the flag still wins and plain ``python`` keeps the old default (DDP121).

A DataParallel script without such a path that kept the flag from a template keeps it as it
was: its reads of it (``get_world_size() if args.local_rank != -1 else 1`` in a step count,
``if args.local_rank in [-1, 0]:``) were written for a per-process batch and never ran in the
original; at -1 they still do what the original did, while the migration's own set-up reads
``LOCAL_RANK`` (so :func:`dp2ddp.migrate.own_check` does not ask lint rule DDP011 of it).
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from dp2ddp.codemods.context import Context, add_kwarg
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.ranks import local_rank_arguments
from dp2ddp.model.syntax import kwarg

_NOTE = "--local_rank defaults to torchrun's LOCAL_RANK"
_KEPT = "# noqa: DDP011 (dp2ddp: kept at its default, as the original ran; the set-up reads LOCAL_RANK)"


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "mixed":
        kept = (_kept(ctx, call) for call, _flag, _env in local_rank_arguments(ctx.m))
        return [f for f in kept if f is not None]
    out: List[Finding] = []
    for call, _flag, from_torchrun in local_rank_arguments(ctx.m):
        if from_torchrun:
            continue  # already torchrun's LOCAL_RANK
        os_ = ctx.name("os")
        default = kwarg(call, "default")
        if default is not None:
            new = ctx.expr('int({os}.environ.get("LOCAL_RANK", {d}))', os=os_, d=default.value)
            out.append(ctx.note(call, "DDP121", _NOTE, [Replace(ctx.cst(default.value), new)]))
        else:
            out.append(ctx.note(call, "DDP121", _NOTE, [Replace(ctx.cst(call), lambda u: add_kwarg(
                u, "default", f'int({os_}.environ.get("LOCAL_RANK", -1))'))]))
    return out


def _kept(ctx: Context, call) -> Optional[Finding]:
    """The flag's statement, on one line with no comment of its own, says why it keeps its
    default (a ``# noqa: DDP011`` with the reason): `check` then agrees with the migration."""
    stmt = ctx.m.statement_of(call)
    if stmt is None or stmt.lineno != stmt.end_lineno or not ctx.bridge.alone_on_line(stmt):
        return None
    line = ctx.bridge.statement(stmt)
    if not isinstance(line, cst.SimpleStatementLine) or line.trailing_whitespace.comment is not None:
        return None
    return ctx.note(call, "DDP121", "--local_rank keeps its default (this script has no distributed path of its own: its "
                    "reads of the flag stay as the original ran them)", [Replace(line, lambda u: u.with_changes(
                        trailing_whitespace=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(_KEPT),
                                                                   newline=u.trailing_whitespace.newline)))])
