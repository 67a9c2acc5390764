"""Batches a training loop cuts itself, and the dimension DataParallel split them on.

DataParallel scatters every tensor argument of the forward along ``dim`` (0 unless the
wrap says otherwise). A DataLoader's batches are sharded by the loader migration; a loop
that cuts its own batches by index (``for i in range(0, len(x), bs): xb = x[i:i + bs]``,
or through a helper, ``data, target = get_batch(source, i)``) must cut each process's
share itself. :func:`hand_loops` finds such training loops and, per loop:

* the *cuts*: slices whose start reads the loop index, in the loop or in a function of
  the script the loop calls with the index (the sliced parameter's argument is the
  *source*);
* the batch dimension ``dim`` of the model the loop trains;
* for ``dim != 0`` (sequence-first models, ``(seq_len, batch)`` tensors): the cut runs
  along dimension 0 (time), the batch is dimension ``dim`` of the source, so each
  process takes its share of the source once, before the loop; every argument of the
  forward must come from a cut, from a DataLoader, or be state the model returns and the
  next step feeds back (``output, hidden = model(data, hidden)``), whose initial value is
  shared the same way. Anything else is a ``problem``: DataParallel split it along
  ``dim``, and dp2ddp cannot tell which part is this process's.

:func:`dim_problems` says, for each wrap with ``dim != 0``, why its batches cannot be
followed (``None``: every training loop of it is planned).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from dp2ddp.model.collectives import VarKey, assigned_keys, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.steps import backward_calls, innermost_loop, own_nodes
from dp2ddp.model.syntax import FUNCTIONS
from dp2ddp.model.uses import wrapper_keys
from dp2ddp.model.wraps import Wrap, dp_wraps


@dataclass
class Cut:
    node: ast.AST  # the slice ``x[i:i + bs]`` (kind "slice"), the helper call (kind "helper") or
    # the iterable of batches cut from tensors (kind "iterable": ``zip(x.split(bs), y.split(bs))``)
    kind: str
    source: ast.AST  # the sliced expression, or the argument the helper slices


@dataclass
class HandLoop:
    loop: ast.AST
    index: str  # the loop's index variable
    wrap: Wrap  # the DataParallel wrap of the model the loop trains
    dim: int
    cuts: List[Cut] = field(default_factory=list)
    carried: List[ast.AST] = field(default_factory=list)  # initial values of state fed back (dim != 0)
    keys: Set[VarKey] = field(default_factory=set)  # the variables whose forward the loop runs
    problem: Optional[str] = None
    problem_node: Optional[ast.AST] = None


def wrap_dim(w: Wrap) -> Optional[int]:
    """The dimension DataParallel scatters along (``None``: not a literal)."""
    d = w.args.get("dim")
    if d is None:
        return 0
    if isinstance(d, ast.Constant) and type(d.value) is int:
        return d.value
    if isinstance(d, ast.UnaryOp) and isinstance(d.op, ast.USub) and isinstance(d.operand, ast.Constant):
        return -d.operand.value  # type: ignore[operator]
    return None


def _wrap_keys(m: SemanticModel) -> List[Tuple[Wrap, Set[VarKey]]]:
    got = m.cache.get("batches:wrap-keys")
    if got is None:
        got = []
        for w in dp_wraps(m):
            if w.functional:
                continue
            seeds = set(assigned_keys(m, w.outer))
            got.append((w, wrapper_keys(m, seeds) if seeds else set()))
        m.cache["batches:wrap-keys"] = got
    return got  # type: ignore[return-value]


def trained_forwards(m: SemanticModel, loop: ast.AST) -> List[Tuple[ast.Call, Wrap]]:
    """The forwards of DataParallel-wrapped models in ``loop``'s own passes."""
    out = []
    wraps = _wrap_keys(m)
    for n in own_nodes(m, loop):
        if isinstance(n, ast.Call) and innermost_loop(m, n) is loop:
            k = var_key(m, n.func)
            if k is None:
                continue
            for w, keys in wraps:
                if k in keys:
                    out.append((n, w))
                    break
    return out


def _index_of(loop: ast.AST) -> Optional[str]:
    """``for i in range(...)`` / ``for n, i in enumerate(range(...))``: ``i``."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return None
    it, target = loop.iter, loop.target
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate" and it.args:
        it = it.args[0]
        if not (isinstance(target, ast.Tuple) and len(target.elts) == 2):
            return None
        target = target.elts[1]
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and isinstance(target, ast.Name):
        return target.id
    return None


def _mentions(expr: Optional[ast.AST], name: str) -> bool:
    return expr is not None and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(expr))


def _cut_slice(node: ast.AST, index: str) -> bool:
    return (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and isinstance(node.slice, ast.Slice)
        and _mentions(node.slice.lower, index)
        and isinstance(node.value, (ast.Name, ast.Attribute))
    )


def _helper_cut(m: SemanticModel, call: ast.Call, index: str) -> Optional[ast.AST]:
    """``get_batch(source, i)``: a function of the script, called with the index, that
    slices one of its parameters from the index parameter: the argument it slices."""
    func = m.resolve_call(call)
    if not isinstance(func, FUNCTIONS):
        return None
    params = m.params(func)
    index_params = [p for p in params if _mentions(m.argument_for(func, call, p), index)]
    if not index_params:
        return None
    for n in own_nodes(m, func):
        if (
            isinstance(n, ast.Subscript)
            and isinstance(n.ctx, ast.Load)
            and isinstance(n.slice, ast.Slice)
            and isinstance(n.value, ast.Name)
            and n.value.id in params
            and any(_mentions(n.slice.lower, p) for p in index_params)
        ):
            return m.argument_for(func, call, n.value.id)
    return None


_SPLITS = frozenset({"split", "chunk", "tensor_split"})
TORCH_SPLITS = frozenset({"torch.split", "torch.chunk", "torch.tensor_split"})


def _is_split(m: SemanticModel, call: ast.AST) -> bool:
    """``x.split(bs)``, ``torch.chunk(x, n)``: a tensor cut into batches along dimension 0
    (not ``line.split(",")``: a string's split takes a string or nothing)."""
    if not isinstance(call, ast.Call) or not call.args or any(k.arg == "dim" for k in call.keywords):
        return False
    if m.is_name(call.func, TORCH_SPLITS):
        return len(call.args) >= 2 and isinstance(call.args[0], (ast.Name, ast.Attribute))
    f = call.func
    return (
        isinstance(f, ast.Attribute)
        and f.attr in _SPLITS
        and isinstance(f.value, (ast.Name, ast.Attribute))
        and not (isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str))
        and not m.qualified_names(f.value) & {"torch"}
    )


def _split_iterable(m: SemanticModel, loop: ast.AST) -> Optional[ast.AST]:
    """``for xb, yb in zip(x.split(bs), y.split(bs))`` (also under ``enumerate``): the
    iterable of batches, when it is made by cutting tensors."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return None
    it = loop.iter
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "enumerate" and it.args:
        it = it.args[0]
    if _is_split(m, it):
        return it
    if (
        isinstance(it, ast.Call)
        and m.is_name(it.func, {"builtins.zip"})
        and it.args
        and all(_is_split(m, a) for a in it.args)
    ):
        return it
    return None


def _binds(m: SemanticModel, node: ast.AST, text: str) -> bool:
    from dp2ddp.model.accumulation import assignment_targets, flat_targets

    return any(ast.unparse(t) == text for t in (x for tt in assignment_targets(node) for x in flat_targets(tt)))


def _rebound_in(m: SemanticModel, loop: ast.AST, expr: ast.AST) -> Optional[ast.AST]:
    text = ast.unparse(expr)
    for n in own_nodes(m, loop):
        if n is not loop and _binds(m, n, text):
            return n
    return None


def hand_loops(m: SemanticModel) -> List[HandLoop]:
    got = m.cache.get("batches:hand-loops")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[HandLoop] = []
    loops = []
    for b in backward_calls(m):
        loop = innermost_loop(m, b)
        if loop is not None and loop not in loops:
            loops.append(loop)
    for loop in loops:
        forwards = trained_forwards(m, loop)
        if not forwards:
            continue
        wrap = forwards[0][1]
        dim = wrap_dim(wrap)
        index = _index_of(loop)
        hl = HandLoop(loop=loop, index=index or "", wrap=wrap, dim=dim if dim is not None else 0)
        hl.keys = {k for k in (var_key(m, f.func) for f, _ in forwards) if k is not None}
        if index is not None:
            for n in own_nodes(m, loop):
                if innermost_loop(m, n) is not loop and n is not loop:
                    continue
                if _cut_slice(n, index):
                    hl.cuts.append(Cut(n, "slice", n.value))  # type: ignore[attr-defined]
                elif isinstance(n, ast.Call):
                    src = _helper_cut(m, n, index)
                    if src is not None:
                        hl.cuts.append(Cut(n, "helper", src))
            # a slice inside a helper's argument list is the helper's business
            helpers = [c.node for c in hl.cuts if c.kind == "helper"]
            hl.cuts = [c for c in hl.cuts if c.kind == "helper" or not any(m.contains(h, c.node) for h in helpers)]
        elif hl.dim == 0:
            split = _split_iterable(m, loop)
            if split is not None:
                hl.cuts.append(Cut(split, "iterable", split))
        if not hl.cuts and hl.dim == 0:
            continue
        out.append(hl)
        if dim is None:
            hl.problem, hl.problem_node = "its dim is not a number dp2ddp can read", wrap.call
            continue
        if len({id(w) for _, w in forwards}) > 1:
            hl.problem, hl.problem_node = "the loop trains several wrapped models", forwards[1][0]
            continue
        for c in hl.cuts:
            if c.kind == "iterable":
                continue
            if not isinstance(c.source, (ast.Name, ast.Attribute)):
                hl.problem, hl.problem_node = f"the batch is cut from `{m.source(c.source)}`, an expression dp2ddp cannot share once", c.node
                break
            where = _rebound_in(m, loop, c.source)
            if where is not None:
                hl.problem = f"`{m.source(c.source)}`, the tensor the batches are cut from, changes inside the loop (line {where.lineno})"
                hl.problem_node = c.node
                break
        if hl.problem is None and hl.dim != 0:
            _follow_forwards(m, hl, [f for f, _ in forwards])
    m.cache["batches:hand-loops"] = out
    return out


# --------------------------------------------------------------------------- dim != 0


def _loader_names(m: SemanticModel, loop: ast.AST) -> Set[str]:
    """The names ``loop`` binds from a DataLoader it iterates (sharded by the loader migration)."""
    from dp2ddp.model.epochs import loader_handles, unwrap_iter
    from dp2ddp.model.handles import expr_handle
    from dp2ddp.model.loaders import loaders

    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return set()
    inner = unwrap_iter(loop.iter)
    h = expr_handle(m, inner) if isinstance(inner, (ast.Name, ast.Attribute, ast.Subscript)) else None
    if h is None or not any(h in loader_handles(m, ld) for ld in loaders(m) if ld.training):
        return set()
    return {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}


def _follow_forwards(m: SemanticModel, hl: HandLoop, forwards: List[ast.Call]) -> None:
    """Every argument of the loop's forwards must be this process's share (from a cut, from
    a DataLoader the loop iterates, or state the forward feeds back) or a literal; the
    initial values of fed-back state are recorded in ``hl.carried``."""
    loop = hl.loop
    cut_nodes = [c.node for c in hl.cuts]
    from_loader = _loader_names(m, loop)
    carried: Dict[str, ast.AST] = {}
    SHARE, CONST, OTHER = "share", "const", "other"

    class Problem(Exception):
        def __init__(self, why: str, node: ast.AST) -> None:
            self.why, self.node = why, node

    def combine(kinds: List[str], made: bool) -> str:
        if SHARE in kinds:
            return SHARE
        return OTHER if made or OTHER in kinds else CONST

    def kind(expr: ast.AST, seen: Set[str]) -> str:
        if any(m.contains(expr, c) or m.contains(c, expr) for c in cut_nodes):
            return SHARE
        if isinstance(expr, ast.Constant):
            return CONST
        if isinstance(expr, ast.Name):
            return name_kind(expr, seen)
        if isinstance(expr, ast.Attribute):
            root = expr
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in ("self", "cls"):
                return OTHER
            return kind(expr.value, seen)
        if isinstance(expr, ast.Call):
            parts = list(expr.args) + [k.value for k in expr.keywords]
            if isinstance(expr.func, ast.Attribute):
                parts.append(expr.func.value)
            return combine([kind(p, seen) for p in parts], made=True)
        kids = [c for c in ast.iter_child_nodes(expr) if isinstance(c, ast.expr)]
        return combine([kind(c, seen) for c in kids], made=False)

    def name_kind(name: ast.Name, seen: Set[str]) -> str:
        if name.id in from_loader or name.id in seen:
            return SHARE
        if name.id == hl.index:
            return CONST
        seen = seen | {name.id}
        _, bindings = m.lookup(name.id, m.scope_of(name))
        if bindings and all(b.kind in ("def", "class", "import") for b in bindings):
            return CONST
        inside = [b for b in bindings if m.contains(loop, b.node) and b.node is not loop]
        if not inside:
            return OTHER
        kinds, fed_back = [], False
        for b in inside:
            stmt = b.node if isinstance(b.node, ast.stmt) else m.statement_of(b.node)
            value = getattr(stmt, "value", None)
            if value is not None and any(value is f for f in forwards):
                fed_back = True
                continue
            if value is None:
                raise Problem(f"`{name.id}` is bound at line {stmt.lineno} in a way dp2ddp does not follow", name)  # type: ignore[union-attr]
            kinds.append(kind(value, seen))
        if fed_back:
            outside = [b for b in bindings if not m.contains(loop, b.node)]
            if len(outside) != 1 or outside[0].kind != "assign" or outside[0].value is None:
                raise Problem(f"`{name.id}` is fed back from the forward, and dp2ddp cannot find its one initial value", name)
            init = outside[0]
            if (init.node.lineno, init.node.col_offset) > (loop.lineno, loop.col_offset):  # type: ignore[attr-defined]
                raise Problem(f"`{name.id}` is fed back from the forward, and its initial value comes after the loop", name)
            carried[name.id] = init.value  # type: ignore[assignment]
            return SHARE
        return combine(kinds, made=False)

    try:
        for f in forwards:
            for a in list(f.args) + [k.value for k in f.keywords]:
                if isinstance(a, ast.Starred) or kind(a, set()) == OTHER:
                    raise Problem(
                        f"the forward's input `{m.source(a)}` is not cut from the loop's batches, so dp2ddp cannot tell "
                        "which part of it is this process's", a)
    except Problem as p:
        hl.problem, hl.problem_node = p.why, p.node
        return
    hl.carried = list(carried.values())


def dim_problems(m: SemanticModel) -> List[Tuple[Wrap, str, ast.AST]]:
    """Each DataParallel wrap with ``dim != 0`` whose batches dp2ddp cannot split on that
    dimension: ``(wrap, why, where)``."""
    out = []
    loops = hand_loops(m)
    for w in dp_wraps(m):
        if w.functional:
            continue
        d = wrap_dim(w)
        if d == 0:
            continue
        if d is None:
            out.append((w, "its dim is not a number dp2ddp can read", w.call))
            continue
        keys = next(k for x, k in _wrap_keys(m) if x is w)
        mine = [hl for hl in loops if hl.keys & keys]
        if not mine:
            out.append((w, "dp2ddp finds no training loop (a backward pass) that feeds this model batches it can split", w.call))
            continue
        bad = next((hl for hl in mine if hl.problem is not None), None)
        if bad is not None:
            out.append((w, bad.problem, bad.problem_node or w.call))  # type: ignore[arg-type]
    return out
