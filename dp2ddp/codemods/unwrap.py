"""DataParallel wraps taken off instead of migrated: :func:`eval_only` (a wrap that serves
evaluation only: each rank evaluates with the module it has), :func:`without_parameters_why`
(a wrap of a loss or another module with no parameters), :func:`remove_wrap` (the
edit; also for the DataParallel fallback of a script with its own DDP path) and
:func:`unwrapped_text` (the wrap's chain without the wrapper, which a migrated wrap
keeps)."""

from __future__ import annotations

import ast

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Remove, Replace
from dp2ddp.model.collectives import var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.inference import before_every_wrap
from dp2ddp.model.kinds import SAME_MODULE, without_parameters
from dp2ddp.model.names import DP, DP_FUNCTIONAL
from dp2ddp.model.uses import wrapper_uses
from dp2ddp.model.wrap_context import in_exiting_branch
from dp2ddp.model.wraps import Wrap


def eval_only(m: SemanticModel, w: Wrap) -> bool:
    """The wrap serves evaluation only: it is made inside a function that never trains,
    into a local variable the function keeps to itself (not returned, not stored on
    ``self`` or a global), whose ``state_dict``/``load_state_dict`` and ``.module`` it
    never uses (a DataParallel checkpoint's ``module.`` keys load only into a wrapper); or
    in a branch that ends the program without training (a ``--test-only`` path that
    evaluates and calls ``sys.exit``)."""
    if w.stmt is not None and in_exiting_branch(m, w):
        return True
    func = w.function
    if func is None or not isinstance(w.target, ast.Name) or getattr(func, "name", "") == "__init__":
        return False
    key = var_key(m, w.target)
    if key is None or key[0] != "local" or key[1] is not func:
        return False
    for node in ast.walk(func):
        if isinstance(node, ast.Return) and _hands_back(node.value, w.target.id):
            return False  # ``return net``, ``return net.to(device)``, ``return net, optimizer``: the caller may train it
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return False
    # the wrapper handed to anything but its own forward and nn.Module API (a Trainer, a
    # train() of another module) may be trained there
    # a function it defines (a closure: ignite's ``_update``/``_inference`` handed to an
    # ``Engine``) counts as part of it: its uses are judged alike, and its training is its
    own = {id(func)} | {id(n) for n in ast.walk(func) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))}
    for use in wrapper_uses(m, {key}):
        if id(m.enclosing_function(use.node)) not in own:
            return False
        if use.kind in ("state_dict", "module") and not before_every_wrap(m, use.node, [w]):
            return False  # `module.` keys (`load_state_dict` of a DataParallel checkpoint), `.module`: the wrapper's own
        if use.kind in ("passed", "other", "store"):
            parent = m.parent(use.node)
            if isinstance(parent, ast.Call) and m.is_name(parent.func, {"builtins.isinstance", "builtins.type"}):
                continue  # `if n_gpu > 1 and not isinstance(model, DataParallel)`: a type check
            if not (isinstance(parent, ast.Call) and m.is_name(parent.func, DP | DP_FUNCTIONAL)):
                return False
    return not _trains(m, func)


def _hands_back(value, name: str) -> bool:
    """``value`` (what a ``return`` gives) is the module named ``name`` itself: the name, a
    method chain on it that gives the module back (``net.to(device)``, ``net.cuda().eval()``),
    or an item of a tuple, list or dict literal. Its forward's output
    (``net(x).sum().item()``) is not."""
    if isinstance(value, ast.Name):
        return value.id == name
    if isinstance(value, (ast.Tuple, ast.List)):
        return any(_hands_back(e, name) for e in value.elts)
    if isinstance(value, ast.Dict):
        return any(_hands_back(v, name) for v in value.values)
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in SAME_MODULE:
        return _hands_back(value.func.value, name)
    return False


def without_parameters_why(m: SemanticModel, w: Wrap) -> str:
    """Why a wrap of a module with no parameters (``DP(nn.CrossEntropyLoss())``) is taken off
    (``""``: it is not one). DistributedDataParallel refuses such a module at construction (no
    parameter needs a gradient); bare, each rank runs it on its own share of the batch, as each
    of DataParallel's replicas did."""
    if w.module is None or not without_parameters(m, w.module):
        return ""
    name = m.source(w.module)
    return (f"DataParallel wrap of {name} removed: it has no parameters, which DistributedDataParallel refuses; each rank "
            "runs it on its own share of the batch")


def _trains(m: SemanticModel, func: ast.AST) -> bool:
    """A backward pass or a step in what ``func`` runs, or in a function it defines (a
    closure it hands on: ignite's ``_update``)."""
    nested = [n for n in ast.walk(func) if n is not func and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    calls = list(m.reached_calls(func)) + [c for f in nested for c in ast.walk(f) if isinstance(c, ast.Call)]
    for call in calls:
        fn = call.func
        if isinstance(fn, ast.Attribute) and fn.attr in ("backward", "step"):
            return True
        if m.is_name(fn, {"torch.autograd.backward"}):
            return True
    return False


def remove_wrap(ctx: Context, w: Wrap, why: str = "") -> Finding:
    """Drop the wrap: ``m = DP(m)`` goes away, ``x = DP(m)`` becomes ``x = m``; an ``if``
    left empty goes too. ``why`` is the summary's reason (evaluation only by default)."""
    m = ctx.m
    if w.module is None or w.stmt is None:
        return ctx.block(w.call, "DDP101", "DataParallel wrap in a form dp2ddp cannot remove; migrate this by hand")
    inner_text = unwrapped_text(ctx, w)
    edits = []
    if ctx.mode == "mixed" and _kept_over_a_world_of_one(m, w):
        # the fallback stays a wrap where the original's was one: without a process group
        # (plain python) a DDP over a world of one, so checkpoints keep DataParallel's keys
        fn = ctx.wrap_alone()
        return ctx.note(w.call, "DDP122", "DataParallel fallback: the script's own DDP path runs under torchrun; without a process "
                        f"group (plain python) `{fn}` wraps the model in DistributedDataParallel over a world of one, so its "
                        "checkpoints keep DataParallel's `module.` keys",
                        [Replace(ctx.cst(w.outer), ctx.expr(f"{fn}({{inner}})", inner=ctx.expr(inner_text)))])
    if w.target is not None and inner_text == m.source(w.target) and ctx.bridge.alone_on_line(w.stmt):
        stmt = w.stmt
        owner = m.parent(stmt)
        if (
            isinstance(owner, ast.If)
            and len(owner.body) == 1
            and not owner.orelse
            and owner.body[0] is stmt
            and ctx.bridge.alone_on_line(owner)
            and _block_keeps_other(m, owner)
        ):
            edits.append(Remove(ctx.bridge.statement(owner)))
        else:
            edits.append(Remove(ctx.bridge.statement(stmt)))
    else:
        edits.append(Replace(ctx.cst(w.outer), ctx.expr(inner_text)))
    why = why or ("evaluation-only DataParallel wrap removed: each rank evaluates with its own module" if ctx.mode != "mixed" else
                  "DataParallel fallback removed: the script's own DDP path runs under torchrun")
    return ctx.note(w.call, "DDP122", why, edits)


def _kept_over_a_world_of_one(m: SemanticModel, w: Wrap) -> bool:
    """A mixed script's fallback that becomes ``wrap_alone(model)``: the wrap's value replaces
    the model it wraps (``model = DataParallel(model).cuda()``), not a part of it
    (``model.features = DataParallel(model.features)``: a DDP inside the DDP the own path
    makes of the whole model would nest), where the model trains. One in an evaluation
    function (HF's ``evaluate()``, which rank 0 alone may run) is taken off: the model it
    gets is wrapped already where it trained."""
    whole = (isinstance(w.target, ast.Name) and isinstance(w.module, ast.Name) and w.target.id == w.module.id)
    return whole and (w.function is None or _trains(m, w.function))


def _block_keeps_other(m: SemanticModel, stmt: ast.stmt) -> bool:
    """Removing ``stmt`` does not leave its block empty (the engine adds ``pass`` anyway)."""
    return True


def unwrapped_text(ctx: Context, w: Wrap) -> str:
    """The source of the wrap's chain without the wrapper: ``DP(m).cuda()`` -> ``m.cuda()``."""
    m = ctx.m
    module_text = m.source(w.module)
    if w.outer is w.call:
        return module_text
    full = m.source(w.outer)
    call_text = m.source(w.call)
    i = full.find(call_text)
    if i < 0:  # pragma: no cover - the call is inside its chain
        return module_text
    return full[:i] + _paren(module_text, w.module) + full[i + len(call_text):]


def _paren(text: str, node: ast.AST) -> str:
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        return text
    return f"({text})"
