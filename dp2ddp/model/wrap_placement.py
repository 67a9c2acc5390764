"""Where a DDP wrap goes, given the module's placements.

:func:`absorb_placement`: after the statements that still place or initialise the module;
:func:`late_placements`: placements that would come after it; :func:`late_cuda`: the one
later ``net.cuda()`` (or ``.to(device)`` whose device is the current GPU exactly when CUDA
is available: :func:`device_value`, :func:`on_current_gpu`) the wrap can do first;
:func:`placed_by_dataparallel`: the DataParallel wrap was what placed the module, so the
migrated wrap must place it.
"""

from __future__ import annotations

import ast
from typing import List, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.placement import PLACEMENT, placed_before, placed_in, placements_after
from dp2ddp.model.syntax import FUNCTIONS, root_name


def placed_by_dataparallel(m: SemanticModel, stmt: ast.stmt, module: Optional[ast.AST], target: Optional[ast.AST],
                           outer: Optional[ast.AST] = None, until: Optional[ast.stmt] = None) -> bool:
    """The ``DataParallel`` wrap at ``stmt`` is what puts ``module`` on the GPU: torch's
    ``DataParallel.__init__`` moves the module onto ``device_ids[0]`` when it has exactly one
    device, so a script that never places its model trains on the GPU of a one-GPU machine.
    ``DistributedDataParallel`` moves nothing (and refuses a CPU module with ``device_ids``):
    with one device per process the migrated wrap must place it, as DataParallel did, unless
    the module is placed in the wrap's argument or on the wrapper at once (:func:`placed_in`:
    ``DataParallel(net).to(device)``) or before it, in the same
    function (:func:`placed_before`, ``net = Net().cuda()``), or before ``until``, the
    statement the wrap moves below (:func:`absorb_placement`). Found on an H100 (tests/gpu):
    such scripts ran as DataParallel and their migrations raised at the wrap. The callers place
    only a wrap that ran on every GPU machine (unconditional, or under a CUDA test:
    :func:`~dp2ddp.model.cuda_only.ran_on_every_gpu_machine`): a wrap under ``if
    torch.cuda.device_count() > 1:`` runs with several devices, where DataParallel moves nothing
    (and raises at the first forward of a CPU model), so a script that never places its model
    trains on the CPU wherever it works; that one is warned about (DDP171, docs/known-issues.md)."""
    if module is None or placed_in(m, module) or placed_in(m, outer):  # outer: ``DataParallel(net).cuda()``
        return False
    names = [m.source(module)] + ([m.source(target)] if target is not None else [])
    if until is not None and target is not None and _is_placement(m, until, target):
        return False  # the wrap moves below this placement (absorb_placement)
    return not placed_before(m, stmt, names) and not (until is not None and placed_before(m, until, names))


# --------------------------------------------------------------------------- where the wrap goes


def _is_placement(m: SemanticModel, stmt: ast.stmt, target: ast.AST) -> bool:
    """``t.cuda()``, ``t = t.to(device)``, or an ``if`` that places ``t`` (``if args.ngpu > 0:
    net.cuda(); criterion.cuda()``) and does nothing else with it. Unlike
    :func:`placement_of`, ``t.to("cpu")`` counts too."""
    if isinstance(stmt, ast.If):
        body = stmt.body + stmt.orelse
        placing = [s for s in body if _is_placement(m, s, target)]
        return bool(placing) and all(s in placing or not _mentions(m, s, target) for s in body)
    text = m.source(target)
    value = None
    if isinstance(stmt, ast.Expr):
        value = stmt.value
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and m.source(stmt.targets[0]) == text:
        value = stmt.value
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Attribute)
        and value.func.attr in PLACEMENT
        and m.source(value.func.value) == text
    )


def _mentions_text(m: SemanticModel, stmt: ast.AST, text: str) -> bool:
    for n in ast.walk(stmt):
        if isinstance(n, (ast.Name, ast.Attribute)) and m.source(n) == text:
            return True
    return False


def _mentions(m: SemanticModel, stmt: ast.AST, target: ast.AST) -> bool:
    text = m.source(target)
    root = root_name(target)
    for n in ast.walk(stmt):
        if isinstance(n, (ast.Name, ast.Attribute)) and m.source(n) == text:
            return True
        if isinstance(target, ast.Attribute) and root is not None and root.id != "self" and isinstance(n, ast.Name) and n.id == root.id:
            return True
    return False


# methods whose result is the same through a wrapper (DP/DDP share them with the module)
_WRAPPER_NEUTRAL = {"parameters", "named_parameters", "modules", "named_modules", "children", "named_children", "train", "eval", "zero_grad"}


def _same_through_wrapper(m: SemanticModel, stmt: ast.AST, target: ast.AST) -> bool:
    """Every mention of ``target`` in ``stmt`` calls a method that does the same on the
    wrapper and the module (``optimizer = SGD(net.parameters())``): the wrap may move past it."""
    text = m.source(target)
    found = False
    for n in ast.walk(stmt):
        if isinstance(n, (ast.Name, ast.Attribute)) and m.source(n) == text:
            parent = m.parent(n)
            call = m.parent(parent) if parent is not None else None
            if not (isinstance(parent, ast.Attribute) and parent.attr in _WRAPPER_NEUTRAL and isinstance(call, ast.Call) and call.func is parent):
                return False
            found = True
    return found


def _initialises(m: SemanticModel, stmt: ast.stmt, target: ast.AST) -> bool:
    """``init_weights(net, ...)``, ``net.apply(weights_init)``: the module's weights are set
    (by a function of the script whose name says so, or ``apply``). DDP broadcasts rank 0's
    parameters when it is built, so this must come first."""
    if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
        return False
    call = stmt.value
    text = m.source(target)
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "apply" and m.source(f.value) == text:
        return True
    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return "init" in name.lower() and any(m.source(a) == text for a in call.args)


def _opaque(m: SemanticModel, stmt: ast.stmt) -> bool:
    """A statement the wrap is never moved past: a loop, a ``with``, a ``def``, or a call
    of a function of this script (it may train or read the wrapper)."""
    if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Return, ast.Try)):
        return True
    return any(isinstance(c, ast.Call) and m.resolve_call(c) is not None for c in ast.walk(stmt))


def absorb_placement(m: SemanticModel, anchor: ast.stmt, target: ast.AST, module: Optional[ast.AST] = None) -> ast.stmt:
    """Where the wrap goes: after the statements that still prepare the module.

    The insertion point moves past placements of ``target`` (``t.cuda()``, ``if cuda: t =
    t.cuda()``) and, when the wrapper has its own name (``net = DP(ssd_net)``), past the
    statements that prepare the bare module (``ssd_net.load_weights(...)``,
    ``ssd_net.extras.apply(weights_init)``): DDP broadcasts rank 0's parameters when it
    is built, so initialisation must come first. Statements that mention neither are
    passed only when such a statement follows; the first other use of the target, a
    loop, a ``with`` or a call of the script's functions stops the search."""
    best = anchor
    root = root_name(module) if module is not None else None
    target_root = root_name(target)
    separate = root is not None and target_root is not None and root.id != target_root.id and root.id != "self"
    from dp2ddp.model.dp_idioms import asserting_helper_statements

    dropped = asserting_helper_statements(m)
    for s in m.siblings_after(anchor):
        if _is_placement(m, s, target) or _initialises(m, s, target):
            best = s
            continue
        if id(s) in dropped:
            continue  # patch_replication_callback(model): removed by dp_idioms (DDP126)
        if _mentions(m, s, target) and not _same_through_wrapper(m, s, target):
            break
        if separate and _mentions_text(m, s, root.id) and not isinstance(s, (ast.For, ast.AsyncFor, ast.While) + FUNCTIONS):  # type: ignore[union-attr]
            best = s
            continue
        if _opaque(m, s):
            break
    return best


def late_cuda(m: SemanticModel, anchor: ast.stmt, target: ast.AST, module: Optional[ast.AST],
              everywhere: bool = False) -> Optional[ast.stmt]:
    """The one later placement of the module, when the wrap can do it first: ``net.cuda()``
    (no device: the current one, the rank's after ``set_device``), as a statement of the
    same function that runs on every path after the wrap point (no ``if``, loop, ``try`` or
    ``with`` around it that the wrap is not in too, but ``if torch.cuda.is_available():``,
    the test the wrap's own placement makes). ``DistributedDataParallel(net.cuda()
    if torch.cuda.is_available() else net, ...)`` then has its parameters on the device it
    needs, and the later ``net.cuda()`` moves nothing. ``None`` otherwise (a ``.to(device)``
    whose device may be the CPU on a GPU machine stays refused; one whose device is the
    current GPU exactly when CUDA is available is the same placement: :func:`on_current_gpu`).

    ``everywhere``: the wrap ran on every GPU machine (unconditional, or under a CUDA test:
    :func:`~dp2ddp.model.cuda_only.ran_on_every_gpu_machine`). Then the later placement may
    sit under any ``if`` (hendrycks' ``net = DataParallel(net, ...)``, a checkpoint loaded,
    then ``if args.ngpu > 0: net.cuda()``): on a GPU machine DataParallel needs the module on
    its first device at the first forward (it raises otherwise, or with one device puts it
    there itself), so wherever the original runs on a GPU its module is on the GPU before it
    is used, and placing it at the wrap changes nothing the original did."""
    late = late_placements(m, anchor, target, module)
    if len(late) != 1:
        return None
    s = late[0]
    value = s.value if isinstance(s, (ast.Expr, ast.Assign)) else None
    if not (isinstance(value, ast.Call) and on_current_gpu(m, value)):
        return None
    func = m.enclosing_function(anchor)
    if m.enclosing_function(s) is not func:
        return None
    around = {id(a) for a in m.ancestors(anchor)}
    child: ast.AST = s
    for a in m.ancestors(s):
        if a is func or isinstance(a, ast.Module):
            break
        cuda_test = (isinstance(a, ast.If) and isinstance(a.test, ast.Call) and m.is_name(a.test.func, {"torch.cuda.is_available"})
                     and any(b is child for b in a.body)) or (everywhere and isinstance(a, ast.If))
        if (isinstance(a, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith))
                and id(a) not in around and not cuda_test):
            return None
        child = a
    return s


def on_current_gpu(m: SemanticModel, call: ast.Call) -> bool:
    """``x.cuda()``, or ``x.to(device)`` whose device is the current GPU whenever CUDA is
    available and the CPU otherwise (``"cuda"``, ``torch.device("cuda")``, ``"cuda" if
    torch.cuda.is_available() else "cpu"``, directly or through a name bound once to such a
    value: :func:`device_value`). Both place the module where the wrap's ``.cuda() if
    torch.cuda.is_available()`` does: the current device, which the migration's set-up
    makes the rank's (``torch.cuda.set_device(local_rank)``)."""
    f = call.func
    if not isinstance(f, ast.Attribute):
        return False
    if f.attr == "cuda":
        return not call.args and not call.keywords
    if f.attr != "to":
        return False
    if len(call.args) == 1 and not call.keywords:
        arg = call.args[0]
    elif not call.args and len(call.keywords) == 1 and call.keywords[0].arg == "device":
        arg = call.keywords[0].value
    else:
        return False  # a dtype or other arguments change more than the device
    return device_value(m, arg) in ("cuda", "cuda-if-available")


_DEVICE_DEPTH = 4


def device_value(m: SemanticModel, expr: ast.AST, depth: int = 0) -> Optional[str]:
    """What device ``expr`` names, followed through the values it is made of: ``"cuda"`` (the
    current GPU: ``"cuda"``, ``torch.device("cuda")``; not ``"cuda:0"``), ``"cpu"``,
    ``"cuda-if-available"`` (``"cuda" if torch.cuda.is_available() else "cpu"``, the test
    negated with the branches swapped, or ``torch.device(...)`` of it), or ``None``. A name
    counts only where the model records one binding of it, an assignment (bound once and
    never again: no spelling is trusted)."""
    if depth > _DEVICE_DEPTH:
        return None
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value if expr.value in ("cuda", "cpu") else None
    if isinstance(expr, ast.Call) and m.is_name(expr.func, {"torch.device"}):
        if len(expr.args) == 1 and not expr.keywords:
            return device_value(m, expr.args[0], depth + 1)
        return None
    if isinstance(expr, ast.IfExp):
        test, body, orelse = expr.test, expr.body, expr.orelse
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, body, orelse = test.operand, orelse, body
        if not (isinstance(test, ast.Call) and not test.args and not test.keywords
                and m.is_name(test.func, {"torch.cuda.is_available"})):
            return None
        if device_value(m, body, depth + 1) in ("cuda", "cuda-if-available") and device_value(m, orelse, depth + 1) == "cpu":
            return "cuda-if-available"
        return None
    if isinstance(expr, ast.Name):
        bindings = m.bindings_of(expr)
        if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].value is None:
            return None
        b = bindings[0]
        if isinstance(b.node, ast.Assign) and len(b.node.targets) != 1:
            return None
        return device_value(m, b.value, depth + 1)  # type: ignore[arg-type]
    return None


def late_placements(m: SemanticModel, anchor: ast.stmt, target: ast.AST, module: Optional[ast.AST]) -> List[ast.stmt]:
    """Placements of the wrapped module (``module``, the wrap's argument) or the wrapper's
    name (``target``) after ``anchor``."""
    names = {m.source(target)}
    if module is not None:
        names.add(m.source(module))
    return placements_after(m, anchor, names)
