"""``torch.load`` without ``map_location`` gets one.

Without it every rank loads a checkpoint onto the device it was saved from — GPU 0 for
a DataParallel script — so all ranks crowd GPU 0. A load that feeds ``load_state_dict``
(directly, or through a variable and its items) goes to ``"cpu"``: ``load_state_dict``
copies into the parameters wherever they are, and optimizers move their state to their
parameters' device. Anything else is mapped onto the rank's own device, CPU tensors
staying on the CPU, which is what the original got on one GPU.
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Replace
from dp2ddp.model.call_args import LOAD_PARAMS, argument
from dp2ddp.model.collectives import assigned_keys, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import LOAD

_RANK_DEVICE = 'lambda storage, loc: storage.cuda() if loc.startswith("cuda") else storage'


def feeds_load_state_dict(m: SemanticModel, call: ast.Call) -> bool:
    """The loaded object ends up in a ``load_state_dict(...)`` argument."""
    cur: ast.AST = call
    for a in m.ancestors(call):
        if isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute) and a.func.attr == "load_state_dict" and cur is not a.func:
            return True
        if isinstance(a, ast.stmt):
            break
        cur = a
    keys = set(assigned_keys(m, call))
    if not keys:
        return False
    for sd in m.nodes(ast.Call):
        if isinstance(sd.func, ast.Attribute) and sd.func.attr == "load_state_dict":
            for arg in list(sd.args) + [k.value for k in sd.keywords]:
                for n in ast.walk(arg):
                    if isinstance(n, (ast.Name, ast.Attribute)) and var_key(m, n) in keys:
                        return True
    return False


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    for call in m.calls(LOAD):
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            continue
        if argument(call, LOAD_PARAMS, "map_location") is not None:
            continue
        if feeds_load_state_dict(m, call):
            value, what = '"cpu"', "map_location=\"cpu\": the state is copied to the model's device by load_state_dict"
        else:
            value, what = _RANK_DEVICE, "map_location onto this rank's device (CUDA tensors) instead of GPU 0"
        from dp2ddp.codemods.context import add_kwarg

        out.append(ctx.note(call, "DDP136", f"torch.load gets {what}", [Replace(ctx.cst(call), lambda u, v=value: add_kwarg(u, "map_location", v))]))
    return out
