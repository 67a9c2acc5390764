"""Explicit CUDA device indices follow the local rank.

The process-group set-up calls ``torch.cuda.set_device(local_rank)``, so ``"cuda"``
means "this rank's GPU". ``"cuda:0"`` and ``.cuda(0)`` (GPU 0, where DataParallel
gathers) become ``"cuda"`` and ``.cuda()``, and a literal ``torch.cuda.set_device(0)``
is dropped. Other fixed indices and ``CUDA_VISIBLE_DEVICES`` edits are reported.
"""

from __future__ import annotations

import ast
import re
from typing import List

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Remove, Replace
from dp2ddp.model.names import CUDA_SET_DEVICE

_CUDA_INDEX = re.compile(r"^cuda:(\d+)$")


_GPU_LIST = re.compile(r"gpu_?ids|gpus|device_ids|devices|gpu_list", re.IGNORECASE)


def _first_gpu(m, node: ast.AST) -> bool:
    """``gpu_ids[0]``, ``opt.gpu_ids[0]``, ``args.gpus[0]``: the first GPU of a list the script
    was given (DataParallel's device 0)."""
    if not isinstance(node, ast.Subscript) or not (isinstance(node.slice, ast.Constant) and node.slice.value == 0):
        return False
    v = node.value
    name = v.id if isinstance(v, ast.Name) else v.attr if isinstance(v, ast.Attribute) else ""
    return bool(_GPU_LIST.fullmatch(name))


def _first_of_a_list(node: ast.AST) -> bool:
    """``ids[0]``, ``args.gpus[0]``: the first item of a list, the index a device string
    formats with ``cuda:`` (DataParallel's device 0, whatever the list is called)."""
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 0
            and isinstance(node.value, (ast.Name, ast.Attribute)))


def _first_gpu_use(ctx: Context, call: ast.Call) -> Finding:
    m = ctx.m
    arg = call.args[0]
    if m.is_name(call.func, CUDA_SET_DEVICE):
        stmt = m.statement_of(call)
        if isinstance(stmt, ast.Expr) and stmt.value is call and ctx.bridge.alone_on_line(stmt):
            return ctx.note(call, "DDP134", f"torch.cuda.set_device({m.source(arg)}) removed: the set-up selects the local rank's GPU",
                            [Remove(ctx.bridge.statement(stmt))])
        return ctx.warn(call, "DDP109", f"set_device({m.source(arg)}): under DDP each rank uses its own GPU")
    if call.func.attr == "cuda":  # type: ignore[attr-defined]
        return ctx.note(call, "DDP134", f".cuda({m.source(arg)}) -> .cuda(): this rank's GPU",
                        [Replace(ctx.cst(call), lambda u: u.with_changes(args=[]))])
    torch = ctx.name("torch")
    return ctx.note(call, "DDP134", f".to({m.source(arg)}) -> .to(torch.cuda.current_device()): this rank's GPU",
                    [Replace(ctx.cst(arg), ctx.expr("{t}.cuda.current_device()", t=torch))])


def propose(ctx: Context) -> List[Finding]:
    if ctx.mode != "plain":
        return []
    m = ctx.m
    out: List[Finding] = []
    joined = {id(v) for j in m.nodes(ast.JoinedStr) for v in j.values}
    for s in m.nodes(ast.Constant):
        if not isinstance(s.value, str) or id(s) in joined:
            continue
        match = _CUDA_INDEX.match(s.value)
        if not match:
            continue
        node = ctx.cst(s)
        if not isinstance(node, cst.SimpleString):
            continue
        if match.group(1) == "0":
            quote = node.quote
            out.append(ctx.note(s, "DDP134", f'"{s.value}" -> "cuda": the current device, which is this rank\'s GPU',
                                [Replace(node, cst.SimpleString(f"{node.prefix}{quote}cuda{quote}"))]))
        else:
            out.append(ctx.warn(s, "DDP109", f'fixed device "{s.value}": under DDP each rank uses its own GPU ("cuda" after set_device)'))
    for call in m.nodes(ast.Call):
        fn = call.func
        if (
            isinstance(fn, ast.Attribute)
            and fn.attr == "cuda"
            and len(call.args) == 1
            and not call.keywords
            and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, int)
        ):
            if call.args[0].value == 0:
                out.append(ctx.note(call, "DDP134", ".cuda(0) -> .cuda(): the current device, which is this rank's GPU",
                                    [Replace(ctx.cst(call), lambda u: u.with_changes(args=[]))]))
            else:
                out.append(ctx.warn(call, "DDP109", "fixed device index in .cuda(N): under DDP each rank uses its own GPU"))
        elif m.is_name(fn, CUDA_SET_DEVICE) and call.args and isinstance(call.args[0], ast.Constant):
            stmt = m.statement_of(call)
            if isinstance(stmt, ast.Expr) and stmt.value is call and ctx.bridge.alone_on_line(stmt):
                owner = m.parent(stmt)
                if (
                    isinstance(owner, ast.If)
                    and not owner.orelse
                    and owner.body == [stmt]
                    and "cuda" in m.source(owner.test)
                    and m.block_of(owner) is not None
                    and ctx.bridge.alone_on_line(owner)
                ):
                    stmt = owner  # `if torch.cuda.is_available(): set_device(0)` goes as a whole
                out.append(ctx.note(call, "DDP134", "torch.cuda.set_device(<fixed index>) removed: the set-up selects the local rank's GPU",
                                    [Remove(ctx.bridge.statement(stmt))]))
        elif call.args and _first_gpu(m, call.args[0]) and (
            (isinstance(fn, ast.Attribute) and fn.attr in ("to", "cuda")) or m.is_name(fn, CUDA_SET_DEVICE)
        ):
            out.append(_first_gpu_use(ctx, call))
        elif (
            isinstance(fn, ast.Attribute)
            and fn.attr in ("to", "cuda")
            and call.args
            and isinstance(call.args[0], ast.Subscript)
            and any(w in m.source(call.args[0].value).lower() for w in ("gpu", "device"))
        ):
            out.append(ctx.warn(call, "DDP109", f"placed on a fixed device ({m.source(call.args[0])}): under DDP each rank must use its own GPU "
                                "(torch.cuda.current_device() after the set-up)"))
    for call in m.nodes(ast.Call):
        # 'cuda:{}'.format(gpu_ids[0]) -> "cuda"
        f = call.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "format"
            and isinstance(f.value, ast.Constant)
            and f.value.value == "cuda:{}"
            and len(call.args) == 1
            and not call.keywords
            and _first_gpu(m, call.args[0])
        ):
            out.append(ctx.note(call, "DDP134", f"{m.source(call)} -> \"cuda\": this rank's GPU (the set-up selects it)",
                                [Replace(ctx.cst(call), ctx.expr('"cuda"'))]))
    for j in m.nodes(ast.JoinedStr):
        # f"cuda:{n_gpu_use[0]}" -> "cuda": the first of the GPUs the script was given
        parts = j.values
        if (len(parts) == 2 and isinstance(parts[0], ast.Constant) and parts[0].value == "cuda:"
                and isinstance(parts[1], ast.FormattedValue) and parts[1].format_spec is None and parts[1].conversion == -1
                and _first_of_a_list(parts[1].value)):
            out.append(ctx.note(j, "DDP134", f"{m.source(j)} -> \"cuda\": this rank's GPU (the set-up selects it)",
                                [Replace(ctx.cst(j), ctx.expr('"cuda"'))]))
    for sub in m.nodes(ast.Subscript):
        key = sub.slice
        if m.is_name(sub.value, {"os.environ"}) and isinstance(key, ast.Constant) and key.value == "CUDA_VISIBLE_DEVICES":
            out.append(ctx.warn(sub, "DDP109", "CUDA_VISIBLE_DEVICES set in the script: with torchrun, give every rank all GPUs and let LOCAL_RANK pick one"))
    return out
