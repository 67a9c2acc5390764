"""DDP016: `torch.save` of a whole DataParallel/DDP wrapper."""

from __future__ import annotations

import ast
from typing import Iterator, List, Set

from dp2ddp.findings import Fix
from dp2ddp.model.checkpoints import saved_parts
from dp2ddp.model.collectives import VarKey, outer_chain, var_key, wrapped_vars
from dp2ddp.model.names import DDP, DP, SAVE
from dp2ddp.model.uses import wrapper_keys
from dp2ddp.model.wraps import conditions
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, cached, tails


def _wrapper_keys(m, ddp: bool) -> Set[VarKey]:
    """Variables that hold a DDP wrapper (``ddp``) or a DataParallel one: the model's wrap
    facts, followed through returns and parameters."""
    def compute():
        ddp_keys = wrapped_vars(m)
        seeds = ddp_keys if ddp else wrapped_vars(m, dp=True) - ddp_keys
        return wrapper_keys(m, seeds)

    return cached(m, f"ddp016:{'ddp' if ddp else 'dp'}", compute)


def _wraps_of(m, key: VarKey, names) -> List[ast.stmt]:
    """The statements that bind ``key`` to a wrap of ``names`` (DDP or DataParallel)."""
    out = []
    for call in m.calls(names):
        outer = outer_chain(m, call)
        parent = m.parent(outer)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and any(
            var_key(m, t) == key for t in (parent.targets if isinstance(parent, ast.Assign) else [parent.target])
        ):
            out.append(parent)
    return out


def _rebound_before(m, node: ast.AST, wraps: List[ast.stmt], keys: Set[VarKey]) -> bool:
    """``node`` (a plain name) was last assigned, before it is read here in the same scope,
    by something that is not a wrapper (``model = model.module``, or the save comes before
    the wrap): it does not hold the wrapper here. A wrapper comes from a wrap, or from a
    call of a function that returns one (``keys`` holds its local)."""
    if not isinstance(node, ast.Name):
        return False
    here = m.position(node)
    scope = m.scope_of(node)
    earlier = [
        b for b in m.bindings_of(node)
        if b.kind == "assign" and m.scope_of(b.node) is scope and m.position(b.node) < here
    ]
    if not earlier:
        return False
    last = max(earlier, key=lambda b: m.position(b.node))
    if last.node in wraps or last.value is None:
        return False
    if isinstance(last.value, ast.Call):
        func = m.resolve_call(last.value)
        if func is not None and any(k[0] == "local" and k[1] is func for k in keys):
            return False
    return True


def _to_module(name: ast.AST):
    def build(bridge):
        import libcst as cst

        from dp2ddp.engine import Replace

        return [Replace(bridge.cst(name), lambda updated: cst.Attribute(value=updated, attr=cst.Name("module")))]

    return build


def check(m) -> Iterator[Hit]:
    seen: Set[int] = set()
    for call in m.calls(SAVE):
        for item in saved_parts(m, call):
            if id(item) in seen or not isinstance(item, (ast.Name, ast.Attribute)):
                continue
            key = var_key(m, item)
            if key is None:
                continue
            for ddp in (True, False):
                if key not in _wrapper_keys(m, ddp):
                    continue
                wraps = _wraps_of(m, key, DDP if ddp else DP)
                if _rebound_before(m, item, wraps, _wrapper_keys(m, ddp)):
                    break
                seen.add(id(item))
                text = m.source(item)
                # `.module` is right only where the variable surely holds the wrapper: a DDP
                # wrap this module makes, under no condition (a DataParallel wrap is the
                # migration's to change: DDP001's fix)
                sure = ddp and wraps and len(wraps) == len(_wraps_of(m, key, DDP | DP)) and not any(
                    conditions(m, w) for w in wraps
                )
                fix = Fix(build=_to_module(item), description=f"save {text}.module") if sure else None
                kind = "DDP" if ddp else "DataParallel"
                yield Hit(item, message=MESSAGE.format(kind=kind, what=text), fix=fix)
                break


MESSAGE = (
    "`torch.save` of the whole {kind} wrapper `{what}`: the file loads only where the wrapper can be rebuilt; "
    "save `{what}.module` (or `{what}.module.state_dict()`)"
)

_DDP = (
    "import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
    "dist.init_process_group(\"gloo\")\nmodel = DDP(Net())\n"
)

RULE = Rule(
    code="DDP016",
    name="whole-wrapper-saved",
    message=MESSAGE.format(kind="DDP", what="model"),
    what=(
        "Checks for `torch.save` of a DataParallel or DistributedDataParallel wrapper itself: `torch.save(model, "
        "path)`, or a dict, list or tuple that holds it (`torch.save({\"net\": model, \"epoch\": epoch}, path)`, "
        "also through a name assigned once). What holds a wrapper is the model's wrap facts "
        "(`dp2ddp.model.collectives.wrapped_vars`, followed through returns and parameters by "
        "`dp2ddp.model.uses.wrapper_keys`)."
    ),
    why=(
        "`torch.save` pickles the object whole: the wrapper's class, its `module.` prefix on every key, and for DDP "
        "its process group, which `torch.load` rebuilds from the default group — loading the file then needs "
        "`init_process_group` first, and a DataParallel wrapper saved before the migration to DDP loads as a wrapper "
        "the new script no longer makes. Inference code, another machine or a later version of the script cannot "
        "load the checkpoint without the training setup."
    ),
    fix=(
        "Save the module the wrapper holds: `torch.save(model.module, path)`, or better its state: "
        "`torch.save(model.module.state_dict(), path)` and `model.load_state_dict(torch.load(path))` to load."
    ),
    fix_safety=(
        "Offered only where the variable surely holds a DDP wrapper (one this module makes, under no condition). "
        "The checkpoint then holds the bare module: code that loads it and reaches for `.module` must use the "
        "loaded object itself."
    ),
    fixable=True,
    gate=(tails(SAVE), tails(DDP, DP)),
    check=check,
    examples=(
        Invalid(
            _DDP + "torch.save(model, \"model.pt\")\n",
            7, 12, end=(7, 17),
            fixed=_DDP + "torch.save(model.module, \"model.pt\")\n",
        ),
        Invalid(
            _DDP + "state = {\"net\": model, \"epoch\": 3}\ntorch.save(state, \"ckpt.pt\")\n",
            7, 17, end=(7, 22),
            fixed=_DDP + "state = {\"net\": model.module, \"epoch\": 3}\ntorch.save(state, \"ckpt.pt\")\n",
        ),
        Invalid(
            "import torch\nimport torch.nn as nn\n\nmodel = Net()\nif torch.cuda.device_count() > 1:\n"
            "    model = nn.DataParallel(model)\ntorch.save({\"model\": model}, \"ckpt.pt\")\n",
            7, 22, end=(7, 27),
        ),
        Valid(_DDP + "torch.save(model.module.state_dict(), \"model.pt\")\n"),
        Valid(_DDP + "torch.save(model.module, \"model.pt\")\n"),
        Valid(
            "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\nmodel = Net()\n"
            "torch.save(model, \"init.pt\")  # before the wrap\nmodel = DDP(model)\n"
        ),
        Valid(_DDP + "model = model.module\ntorch.save(model, \"model.pt\")\n"),
    ),
)
