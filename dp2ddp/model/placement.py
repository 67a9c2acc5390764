"""Device placement of a module around its wrap.

``DistributedDataParallel(module, device_ids=[d])`` needs the module's parameters on ``d``
when it is built (it checks, and it broadcasts rank 0's values from there). A script whose
placement comes after the wrap (``net = DDP(net)`` ... ``net.cuda()``, or a DataParallel
wrap moved out of ``if args.ngpu > 1:`` above a separate ``if args.ngpu > 0:
net.cuda()``) works on CPU and fails on the first GPU run.

* :func:`placement_of`: ``x.cuda()``, ``x.to(...)``, ``x = x.cuda()`` — the expression placed;
* :func:`placed_before` / :func:`placements_after`: placements of a module's names before and
  after a statement, in the statements of the same function (nested blocks included,
  nested functions not); a placement after the name is bound to another value on every path
  to it places that value, not the module (:func:`rebound_between`, from the model's bindings);
* where a DDP wrap goes: :func:`absorb_placement` (after the statements that still place
  or initialise the module), :func:`late_placements` (placements that would come after
  it) and :func:`late_cuda` (the one later ``net.cuda()`` the wrap can do first).
"""

from __future__ import annotations

import ast
from typing import Iterable, List, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import FUNCTIONS, root_name

PLACEMENT = frozenset({"cuda", "to"})


def placement_of(m: SemanticModel, stmt: ast.AST) -> Optional[ast.AST]:
    """The expression a statement places on a device: ``x.cuda()`` / ``x.to(d)`` as a
    statement, or ``x = x.cuda()``; ``None`` otherwise."""
    value = None
    if isinstance(stmt, ast.Expr):
        value = stmt.value
    elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        value = stmt.value
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in PLACEMENT):
        return None
    if value.func.attr == "to" and value.args and isinstance(value.args[0], ast.Constant) and value.args[0].value == "cpu":
        return None
    placed = value.func.value
    if isinstance(stmt, ast.Assign) and m.source(stmt.targets[0]) != m.source(placed):
        return None
    return placed


def _statements(m: SemanticModel, stmt: ast.stmt) -> List[ast.stmt]:
    """Every statement of the function (or module) of ``stmt``, in source order, nested
    blocks included, nested functions and classes not."""
    func = m.enclosing_function(stmt)
    root = func if func is not None else m.tree
    out: List[ast.stmt] = []
    todo = list(reversed(root.body))  # type: ignore[attr-defined]
    while todo:
        s = todo.pop()
        out.append(s)
        if isinstance(s, FUNCTIONS + (ast.ClassDef,)):
            continue
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(s, field, None)
            if isinstance(block, list):
                todo.extend(reversed(block))
    return out


def _branch(m: SemanticModel, node: ast.AST) -> dict:
    """For each ``if`` above ``node``: which of its blocks holds it."""
    out = {}
    child = node
    for a in m.ancestors(node):
        if isinstance(a, ast.If):
            for field in ("body", "orelse"):
                if any(c is child for c in getattr(a, field, ()) or ()):
                    out[id(a)] = field
        child = a
    return out


def exclusive(m: SemanticModel, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` sit in different branches of one ``if`` (``if``/``else``, an ``elif``
    chain): one run never executes both."""
    ba, bb = _branch(m, a), _branch(m, b)
    for key, field in ba.items():
        other = bb.get(key)
        if other is not None and other != field:
            return True
    return False


def placements_after(m: SemanticModel, stmt: ast.stmt, names: Iterable[str]) -> List[ast.stmt]:
    """Statements after ``stmt`` (same function) that place one of ``names`` (source texts)
    while the name still holds the value it held at ``stmt``: a placement after the name is
    bound anew on every path to it (``net = WideResNet(...)`` ... ``net.cuda()``) places
    another value (:func:`rebound_between`)."""
    wanted = set(names)
    pos = (stmt.end_lineno or stmt.lineno, stmt.end_col_offset or 0)
    out = []
    for s in _statements(m, stmt):
        if (s.lineno, s.col_offset) <= pos or exclusive(m, s, stmt):
            continue
        placed = placement_of(m, s)
        if placed is not None and m.source(placed) in wanted and rebound_between(m, stmt, s, placed) is None:
            out.append(s)
    return out


_REBINDS = frozenset({"assign", "unpack"})


def _rebinding_statements(m: SemanticModel, expr: ast.AST) -> List[ast.stmt]:
    """The statements that may give ``expr`` (a name, or an attribute chain of one) a new
    value: the assignments of its root name in the scope it is read in, as the model records
    them, and for an attribute chain the assignments to that same chain."""
    root = expr if isinstance(expr, ast.Name) else root_name(expr)
    out: List[ast.stmt] = []
    if root is not None and not (root is not expr and root.id == "self"):
        for b in m.bindings_of(root):
            if b.kind not in _REBINDS:
                continue  # a for/with target may hold the module itself; an except or a walrus may not run
            s = b.node if isinstance(b.node, ast.stmt) else m.statement_of(b.node)
            if s is not None:
                out.append(s)
    if isinstance(expr, ast.Attribute):
        text = m.source(expr)
        for s in _statements(m, expr):
            targets = s.targets if isinstance(s, ast.Assign) else [s.target] if isinstance(s, (ast.AnnAssign, ast.AugAssign)) else []
            if any(m.source(t) == text for t in targets):
                out.append(s)
    return out


def _runs_before(m: SemanticModel, first: ast.stmt, later: ast.stmt) -> bool:
    """Whenever ``later`` runs, ``first`` has run before it in the same pass: ``first``'s
    block holds ``later`` (or a statement around it) after ``first``."""
    around = {id(later)} | {id(a) for a in m.ancestors(later)}
    return any(id(s) in around for s in m.siblings_after(first))


def rebound_between(m: SemanticModel, start: ast.stmt, placement: ast.stmt, placed: ast.AST) -> Optional[ast.stmt]:
    """A statement after ``start`` that binds ``placed`` (the placed name) anew on every
    path to ``placement``, in the same function: from there on the name holds another
    value, and ``placement`` does not place the one ``start`` saw. Only a value made anew
    counts (:func:`_fresh`: ``x = x.cuda()``, ``x = f(x)`` or an alias may hold the same
    module); a binding in one branch, or in a loop that may not run, does not count."""
    end = (start.end_lineno or start.lineno, start.end_col_offset or 0)
    func = m.enclosing_function(placement)
    for r in _rebinding_statements(m, placed):
        if r is placement or (r.lineno, r.col_offset) <= end or m.enclosing_function(r) is not func:
            continue
        if m.contains(r, start):
            continue
        if not _fresh(m, r, placed):
            continue
        if (r.lineno, r.col_offset) < (placement.lineno, placement.col_offset) and _runs_before(m, r, placement):
            return r
    return None


def _fresh(m: SemanticModel, stmt: ast.stmt, placed: ast.AST) -> bool:
    """``stmt`` binds a value made anew, not the one the name held: an assignment of a call
    that reads neither the name nor anything of it (``net = WideResNet(...)``). ``x =
    x.cuda()``, ``net = convert(net)``, ``net = base`` (an alias may be the wrapped module),
    a ``for``/``with`` target may all hold the same module: they do not count."""
    value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
    if not isinstance(value, ast.Call):
        return False
    root = placed if isinstance(placed, ast.Name) else root_name(placed)
    if root is None:
        return False
    return not any(isinstance(n, ast.Name) and n.id == root.id for n in ast.walk(value))


def placed_before(m: SemanticModel, stmt: ast.stmt, names: Iterable[str]) -> bool:
    """A statement before ``stmt`` (same function) places one of ``names``."""
    wanted = set(names)
    for s in _statements(m, stmt):
        if (s.lineno, s.col_offset) >= (stmt.lineno, stmt.col_offset):
            break
        if exclusive(m, s, stmt):
            continue
        placed = placement_of(m, s)
        if placed is not None and m.source(placed) in wanted:
            return True
        # net = Net().cuda(): made on its device
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and m.source(s.targets[0]) in wanted:
            v = s.value
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in PLACEMENT:
                return True
    return False


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


def placed_anywhere(m: SemanticModel, names: Iterable[str]) -> bool:
    """Some statement of the module places a value spelled as one of ``names`` (``model.to(args.device)``
    in ``main()`` before ``train(args, model)`` wraps it). By spelling, across functions: only
    to keep a warning quiet (DDP171), never to edit."""
    wanted = set(names)
    for s in m.nodes(ast.Expr, ast.Assign):
        placed = placement_of(m, s)
        if placed is not None and m.source(placed) in wanted:
            return True
    return False


def placed_by_maker(m: SemanticModel, value: ast.AST) -> bool:
    """Every value ``value`` may hold is returned by a function (this module's or a project
    module's) that places what it returns (``def make(): model = Net(); if
    torch.cuda.is_available(): model.cuda(); return model``, few-shot-meta-baseline's
    ``models.make``, also through ``load()`` that returns what ``make()`` made). Only to keep
    a warning quiet (DDP171), never to edit."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.names import DP

    found = [(n, p) for n, p in origins(m, value) if not (isinstance(n, ast.Call) and m.qualified_names(n.func) & DP)]
    return bool(found) and all(not path and isinstance(node, ast.Call) and _maker_places(m, node, 0) for node, path in found)


def _maker_places(m: SemanticModel, call: ast.Call, depth: int) -> bool:
    """``call`` runs a function that places every value it returns (``None`` aside)."""
    from dp2ddp.model.project_defs import project_def

    func, fm = m.resolve_call(call), m
    if func is None and isinstance(call.func, (ast.Name, ast.Attribute)):
        got = project_def(m, call.func)
        func, fm = (got[1], got[0]) if got is not None else (None, m)
    if depth > 2 or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    returned = [r.value for r in ast.walk(func) if isinstance(r, ast.Return) and r.value is not None
                and not (isinstance(r.value, ast.Constant) and r.value.value is None)]
    placed = {fm.source(p) for s in ast.walk(func) if isinstance(s, (ast.Expr, ast.Assign))
              for p in [placement_of(fm, s)] if p is not None}

    def places(r: ast.AST) -> bool:
        if fm.source(r) in placed:
            return True
        if isinstance(r, ast.Call):
            return _maker_places(fm, r, depth + 1)
        if isinstance(r, ast.Name):
            _, bindings = fm.lookup(r.id, fm.scope_of(r))
            return bool(bindings) and all(b.kind == "assign" and isinstance(b.value, ast.Call)
                                          and _maker_places(fm, b.value, depth + 1) for b in bindings)
        return False

    return bool(returned) and all(places(r) for r in returned)


def placed_in(m: SemanticModel, expr: Optional[ast.AST]) -> bool:
    """``expr`` (a wrap's module argument) places the module as it is wrapped:
    ``model.cuda()``, ``model.to(device)``, or what the migration writes for a model the
    script places later, ``model.cuda() if torch.cuda.is_available() else model`` (on CPU
    there is no device to place it on)."""
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("cuda", "to"):
        return True
    return (isinstance(expr, ast.IfExp) and isinstance(expr.test, ast.Call)
            and m.is_name(expr.test.func, {"torch.cuda.is_available"}) and placed_in(m, expr.body))


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


_PLACING = frozenset({"to", "cuda"})


def placed_by_caller(m: SemanticModel, stmt: ast.stmt, target: Optional[ast.AST]) -> Optional[str]:
    """Where a caller places the model a function returns after wrapping it: the wrap is in
    ``_build_model``, which returns the wrapper, and a project module calls
    ``self._build_model().to(self.device)`` (Autoformer's ``Exp_Basic.__init__``). Under DDP the
    wrapper must be built over a module already on this rank's device; a placement after it,
    on a device the caller chose for the one process of the original, comes too late (on a
    GPU the wrap raises). ``"path:line"`` (relative to this module's folder) or ``None``."""
    import os

    from dp2ddp.model.project_defs import file_model
    from dp2ddp.project import project_modules

    func = m.enclosing_function(stmt)
    if func is None or target is None or not isinstance(target, ast.Name):
        return None
    returned = any(isinstance(n, ast.Return) and isinstance(n.value, ast.Name) and n.value.id == target.id
                   and m.enclosing_function(n) is func for n in ast.walk(func))
    if not returned or m.path in ("<string>", "<stdin>", "-") or not os.path.exists(m.path):
        return None
    name = func.name  # type: ignore[attr-defined]
    here = os.path.realpath(m.path)
    places = [(here, os.path.basename(m.path))] + [(real, rel) for real, (rel, _d) in project_modules(m.path).items()]
    for real, rel in places:
        pm = m if real == here else file_model(real)
        if pm is None:
            continue
        for call in pm.nodes(ast.Call):
            f = call.func
            if not (isinstance(f, ast.Attribute) and f.attr in _PLACING and isinstance(f.value, ast.Call)):
                continue
            if f.attr == "cuda" and not call.args and not call.keywords:
                continue  # the current device, the rank's once set_device ran: the wrap places it there first
            inner = f.value.func
            if (isinstance(inner, ast.Attribute) and inner.attr == name) or (isinstance(inner, ast.Name) and inner.id == name):
                return f"{rel}:{call.lineno}"
    return None
