"""Evaluation loops whose results are sums: what ``rewrite --shard-eval`` may split by batch.

An *evaluation loop* is a ``for`` over an evaluation DataLoader the script makes (one that
:mod:`dp2ddp.model.loaders` calls evaluation and the migration otherwise leaves whole on
every rank, DDP108), directly or through ``enumerate``/``tqdm``, in the function that made
it or in one it is passed to (:mod:`dp2ddp.model.flow`). Such a loop can be shared out by
whole batches when everything it leaves behind is a sum the original added up:

* its *accumulators*: names bound to a number (``0``, ``0.0``) or a zero tensor before the
  loop, changed in it only by ``+=``, and read only after it (``correct += (pred ==
  y).sum().item()``, ``test_loss += loss.item()``, ``total += y.size(0)``);
* ``enumerate``'s index, when it is read after the loop (``test_loss / (batch_idx + 1)``):
  its value there is the original's last index, whatever the rank evaluated;
* nothing else escapes an iteration: no list appended, nothing changed in place, no
  metric object's ``update()``, no print, log or file written, no ``.backward()``, no
  ``return``/``break``, no value set in the loop read after it, no call of a function
  whose effects the model does not follow (the script's own functions are read, with the
  same rules);
* it runs with gradients off (``torch.no_grad()``/``inference_mode()``, or a function
  decorated with them): a DDP forward with gradients on syncs buffers on every batch,
  which needs the same number of batches on every rank;
* it runs on every rank the same number of times: every ``if`` (and ``while``) around it
  and around the calls that reach it, and every early ``return`` before it, tests a value
  that is the same on every rank (:func:`same_on_every_rank`: constants, the script's
  options, epoch and step counters).

:func:`eval_loops` gives each evaluation loop with its accumulators, or the reason it
stays whole (``problem``, at ``problem_node``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from dp2ddp.model.collectives import MODULE_RETURNING, collective_of, is_wrapped_forward
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.loaders import Loader
from dp2ddp.model.project_defs import project_def
from dp2ddp.model.ranks import ends_flow, mentions_rank
from dp2ddp.model.syntax import FUNCTIONS, LOOPS, terminal
from dp2ddp.model.training import is_backward, iterated, under_no_grad
from dp2ddp.model.writers import writers

# builtins an iteration may call: they keep nothing
_PURE_BUILTINS = frozenset({
    "len", "range", "int", "float", "bool", "str", "min", "max", "abs", "sum", "round", "isinstance", "zip",
    "enumerate", "list", "tuple", "dict", "set", "sorted", "reversed", "any", "all", "map", "filter", "getattr",
    "hasattr", "type", "iter", "divmod", "pow",
})
# methods that may be called on a value made outside the loop (a tensor, a dict of options,
# the model): they read it and keep nothing
_PURE_METHODS = frozenset({
    "size", "dim", "numel", "item", "tolist", "to", "cpu", "cuda", "float", "double", "half", "long", "int",
    "bool", "detach", "clone", "view", "view_as", "reshape", "contiguous", "eq", "ne", "argmax", "argmin", "max",
    "min", "sum", "mean", "std", "get", "keys", "values", "items", "format", "forward", "eval", "t", "unsqueeze",
    "squeeze", "flatten", "expand", "expand_as", "permute", "transpose", "index_select", "masked_select", "topk",
    "softmax", "log_softmax", "sigmoid", "exp", "log", "abs", "pow", "sqrt", "mul", "add", "sub", "div",
    "matmul", "mm", "bmm", "norm", "numpy", "join", "startswith", "endswith", "lower", "upper", "parameters",
})
_GRADIENTS = frozenset({"torch.autograd.grad", "torch.autograd.backward"})
# builtins whose value is the same wherever its arguments are
_SAME_BUILTINS = frozenset({"len", "int", "float", "abs", "min", "max", "round", "bool", "str", "range", "isinstance",
                            "hasattr", "getattr", "sum", "any", "all"})
MAX_DEPTH = 3


@dataclass
class EvalLoop:
    loop: ast.For
    loaders: List[Loader]
    iterable: ast.AST  # the expression of the loop's header that is the loader
    accumulators: List[str] = field(default_factory=list)
    index: Optional[str] = None  # enumerate's index, read after the loop
    problem: Optional[str] = None  # why the loop stays whole on every rank
    problem_node: Optional[ast.AST] = None


def eval_loops(m: SemanticModel, evaluation: Sequence[Loader]) -> List[EvalLoop]:
    """Every ``for`` over one of the ``evaluation`` loaders, each with what it sums or why it
    stays whole."""
    from dp2ddp.model.flow import origins

    calls = {id(ld.call): ld for ld in evaluation}
    out: List[EvalLoop] = []
    for loop in m.nodes(ast.For):
        values = list(iterated(loop.iter))  # type: ignore[attr-defined]
        found = [(v, [calls[id(n)] for n, path in origins(m, v) if id(n) in calls and not path]) for v in values]
        hits = [(v, lds) for v, lds in found if lds]
        if not hits:
            continue
        value, lds = hits[0]
        got = EvalLoop(loop, list({id(ld.call): ld for ld in lds}.values()), value)  # type: ignore[arg-type]
        _judge(m, got, len(values))
        out.append(got)
    return out


def _judge(m: SemanticModel, e: EvalLoop, n_values: int) -> None:
    loop = e.loop

    def stays(why: str, node: Optional[ast.AST] = None) -> None:
        e.problem, e.problem_node = why, node or loop

    header, index = _header(m, loop)
    if n_values > 1:
        return stays(f"it iterates several values together (`{_short(m, loop.iter)}`)")
    if header is not e.iterable:
        return stays(f"it iterates the loader through `{_short(m, loop.iter)}`, which dp2ddp does not pass through")
    others = [n for n, path in _origins(m, e.iterable) if path or not any(n is ld.call for ld in e.loaders)
              and not (isinstance(n, ast.Constant) and n.value is None)]
    if others:
        return stays(f"`{m.source(e.iterable)}` may also be `{_short(m, others[0])}` (line {others[0].lineno})", others[0])
    if loop.orelse:
        return stays("it has an `else:` block", loop.orelse[0])
    grad = _gradients(m, loop)
    if grad is not None:
        return stays(f"it computes gradients (`{_short(m, grad)}`, line {grad.lineno}): an evaluation under attack "
                     "runs the DDP forward with gradients on", grad)
    if not under_no_grad(m, loop):
        return stays("it runs with gradients on (put it under `torch.no_grad()`): a DDP forward with gradients on "
                     "syncs buffers on every batch, which needs the same number of batches on every rank")
    scope = m.scope_of(loop)
    stored, plain = _stores(m, loop, scope)
    accs: List[str] = []
    for node in _walk(loop.body):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id not in plain:
            name = node.target.id
            if not isinstance(node.op, ast.Add):
                return stays(f"it changes `{name}` with `{_op(node)}=` (line {node.lineno}), not a sum", node)
            if name not in accs:
                accs.append(name)
    local = stored - set(accs)
    for name in sorted(stored & (scope.globals | scope.nonlocals)):
        return stays(f"it sets `{name}`, declared global in its function", loop)
    why = _escape(m, loop.body, local, set(accs), scope, loop, 0)
    if why is not None:
        return stays(f"it {why[1]}", why[0])
    carried = _carried(m, loop, local, scope)
    if carried is not None:
        return stays(f"it carries `{carried.id}` from one batch to the next (line {carried.lineno}): each rank would "
                     "see another batch's value there", carried)
    for name in accs:
        why = _start(m, loop, name, scope)
        if why is not None:
            return stays(why[1], why[0])
    reads = _Reads(m, scope, loop)
    for name in sorted(local):
        r = reads.after(name)
        if r is None:
            continue
        if name == index:
            e.index = index
            continue
        return stays(f"`{name}`, set in the loop, is read after it (line {r.lineno}): its last value differs by rank", r)
    cond = _unproven_condition(m, loop, 0)
    if cond is not None:
        node, why = cond
        return stays(why, node)
    e.accumulators = accs


def _short(m: SemanticModel, node: ast.AST) -> str:
    text = m.source(node).replace("\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def _op(node: ast.AugAssign) -> str:
    return {ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
            ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>",
            ast.MatMult: "@"}.get(type(node.op), "?")


def _origins(m: SemanticModel, expr: ast.AST):
    from dp2ddp.model.flow import origins

    return origins(m, expr)


def _header(m: SemanticModel, loop: ast.For) -> Tuple[ast.AST, Optional[str]]:
    """The expression a loop's header iterates through ``enumerate``/``tqdm``, and
    ``enumerate``'s index name."""
    it, index = loop.iter, None
    if isinstance(it, ast.Call) and terminal(it.func) == "enumerate" and it.args:
        t = loop.target
        if isinstance(t, (ast.Tuple, ast.List)) and t.elts and isinstance(t.elts[0], ast.Name):
            index = t.elts[0].id
        it = it.args[0]
    if isinstance(it, ast.Call) and terminal(it.func) == "tqdm" and it.args:
        it = it.args[0]
    return it, index


def _walk(stmts: Iterable[ast.AST]) -> Iterable[ast.AST]:
    """Every node of ``stmts``, in source order, not entering nested functions or classes
    (a call of one is read where it is made)."""
    todo = list(reversed(list(stmts)))
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, FUNCTIONS + (ast.ClassDef,)):
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(n))))


def _stores(m: SemanticModel, loop: ast.For, scope) -> Tuple[Set[str], Set[str]]:
    """Names the loop binds in its scope: all of them, and those bound other than by an
    augmented assignment."""
    stored: Set[str] = set()
    plain: Set[str] = set()
    for n in _walk([loop.target] + list(loop.body)):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and m.scope_of(n) is scope:
            stored.add(n.id)
            if not isinstance(m.parent(n), ast.AugAssign):
                plain.add(n.id)
        elif isinstance(n, FUNCTIONS + (ast.ClassDef,)):
            stored.add(n.name)
            plain.add(n.name)
    return stored, plain


def _gradients(m: SemanticModel, loop: ast.For) -> Optional[ast.Call]:
    """A ``.backward()`` or ``torch.autograd.grad`` the loop reaches (through the script's
    functions too)."""
    for call in m.reached_calls(loop):
        if is_backward(call) or m.qualified_names(call.func) & _GRADIENTS:
            return call
    return None


def _base(node: ast.AST) -> Optional[ast.Name]:
    """The name an attribute/subscript/call chain starts from (``conf`` of ``conf[t, p]``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node if isinstance(node, ast.Name) else None


def _escape(m: SemanticModel, body: Sequence[ast.AST], local: Set[str], accs: Set[str], scope, loop: ast.AST,
            depth: int) -> Optional[Tuple[ast.AST, str]]:
    """The first thing in ``body`` that leaves a trace outside one iteration, with what it
    does (``"appends ... (line 12)"``); ``local``: names bound in the loop (or in the
    function read); ``accs``: the accumulators, which only ``+=`` may touch."""
    writes = {id(w.call): w.kind for w in writers(m)}
    for n in _walk(body):
        line = f"(line {getattr(n, 'lineno', '?')})"
        if isinstance(n, FUNCTIONS + (ast.ClassDef,)):
            continue  # a local definition: read where it is called
        if isinstance(n, ast.Return) and depth == 0:
            return n, f"returns from inside the loop {line}"
        if isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)):
            return n, f"yields or awaits {line}"
        if isinstance(n, (ast.Global, ast.Nonlocal)):
            return n, f"declares `{', '.join(n.names)}` global {line}"
        if isinstance(n, ast.Break) and depth == 0 and _loop_of(m, n) is loop:
            return n, f"may stop early (`break`, line {n.lineno}): the ranks would not share out the same batches"
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in accs and _same_binding(m, n, scope):
            return n, f"reads `{n.id}` {line}: a running value, which differs by rank"
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
            for t in targets:
                for x in ast.walk(t):
                    if isinstance(x, (ast.Attribute, ast.Subscript)) and isinstance(x.ctx, (ast.Store, ast.Del)):
                        base = _base(x)
                        if base is None or base.id not in local:
                            return x, f"changes `{_short(m, x)}` in place {line}, which outlives the loop"
        if isinstance(n, ast.Call):
            why = _call_escape(m, n, local, accs, scope, loop, depth, writes)
            if why is not None:
                return n, why if why.startswith("calls `") and ", which " in why else f"{why} {line}"
    return None


def _loop_of(m: SemanticModel, node: ast.AST) -> Optional[ast.AST]:
    for a in m.ancestors(node):
        if isinstance(a, LOOPS):
            return a
        if isinstance(a, FUNCTIONS):
            return None
    return None


def _same_binding(m: SemanticModel, name: ast.Name, scope) -> bool:
    return m.lookup(name.id, m.scope_of(name))[0] is scope


# libraries whose functions an iteration may call (they keep nothing of what they are given)
_LIBRARIES = frozenset({
    "torch", "torchvision", "torchaudio", "torchtext", "numpy", "math", "cmath", "operator", "functools", "itertools",
    "collections", "copy", "time", "einops", "scipy", "sklearn", "PIL", "cv2", "timm", "transformers",
})
_RANDOM = ("torch.rand", "torch.randn", "torch.randint", "torch.randperm", "torch.bernoulli", "torch.multinomial",
           "torch.normal", "torch.poisson", "random.", "numpy.random.")
_RANDOM_METHODS = frozenset({"random_", "normal_", "uniform_", "bernoulli_", "exponential_", "geometric_",
                             "cauchy_", "log_normal_"})


def _call_escape(m: SemanticModel, call: ast.Call, local: Set[str], accs: Set[str], scope, loop: ast.AST, depth: int,
                 writes: Dict[int, str]) -> Optional[str]:
    kind = writes.get(id(call))
    if kind is not None:
        return f"{'prints' if kind == 'print' else 'writes'} (`{_short(m, call)}`)"
    f = call.func
    q = m.qualified_names(f)
    if is_backward(call) or q & _GRADIENTS:
        return f"computes gradients (`{_short(m, call)}`)"
    if any(x.startswith(_RANDOM) for x in q) or (isinstance(f, ast.Attribute) and f.attr in _RANDOM_METHODS):
        return f"draws random numbers (`{_short(m, call)}`): each batch would draw other numbers than the original's"
    got = collective_of(m, call)
    if got is not None and got != "DDP forward":
        return f"calls a collective (`{_short(m, call)}`)"
    if any(x.startswith(("sys.stdout", "sys.stderr", "logging.", "warnings.")) for x in q):
        return f"writes (`{_short(m, call)}`)"
    base = _base(f)
    if base is not None and base.id in local:
        return None  # a value of this iteration: `outputs.max(1)`, `pred.eq(y).sum()`
    target = m.resolve_call(call)
    if target is not None:
        if depth >= MAX_DEPTH:
            return f"calls `{_short(m, f)}`, deeper than dp2ddp follows"
        return _function_escape(m, call, target, accs, scope, loop, depth + 1)
    if q and all(x.startswith("builtins.") for x in q):
        names = {x.split(".", 1)[1] for x in q}
        return None if names <= _PURE_BUILTINS else f"calls `{_short(m, f)}`"
    if base is not None and _imported(m, base):
        if all(x.split(".", 1)[0] in _LIBRARIES for x in q):
            return None  # a library function: torch, F, numpy ...
        if isinstance(f, (ast.Name, ast.Attribute)) and project_def(m, f) is not None:
            return f"calls `{_short(m, f)}` of the project, whose effects dp2ddp does not follow"
        return f"calls `{_short(m, f)}`, whose effects dp2ddp does not follow"
    if isinstance(f, ast.Name):
        return None  # a forward of a value made outside the loop: `model(x)`, `criterion(out, y)`
    if isinstance(f, ast.Attribute):
        if f.attr in _PURE_METHODS or is_wrapped_forward(m, call, dp=True) or _torch_object(m, f):
            return None
        return f"calls `{_short(m, f)}(...)` on a value made outside the loop, which may keep what it is given"
    return None


def _imported(m: SemanticModel, name: ast.Name) -> bool:
    _, bindings = m.lookup(name.id, m.scope_of(name))
    return bool(bindings) and all(b.kind == "import" for b in bindings)


def _torch_object(m: SemanticModel, f: ast.Attribute) -> bool:
    """``self.criterion`` bound only to torch objects (``nn.CrossEntropyLoss()``): calling
    it is a forward."""
    got = _origins(m, f)
    return bool(got) and all(_torch_made(m, n) for n, _ in got)


def _torch_made(m: SemanticModel, node: ast.AST) -> bool:
    """A call of a torch class or function, placed or not (``nn.Sequential(...).to(device)``)."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MODULE_RETURNING:
        node = node.func.value
    return isinstance(node, ast.Call) and any(q.startswith("torch.") for q in m.qualified_names(node.func))


def _function_escape(m: SemanticModel, call: ast.Call, func: ast.AST, accs: Set[str], scope, loop: ast.AST,
                     depth: int) -> Optional[str]:
    """What a function of the script the loop calls does that escapes it, if anything."""
    name = getattr(func, "name", "?")
    if m.contains(func, loop):
        return f"calls `{name}` (line {call.lineno}), which holds the loop"
    inner = m.scopes.get(func)
    # its own values; its parameters (``self`` included) are the caller's objects
    local = {n for n, bs in inner.bindings.items() if all(b.kind != "param" for b in bs)} if inner is not None else set()
    why = _escape(m, func.body, local, accs, scope, loop, depth)  # type: ignore[attr-defined]
    if why is None:
        return None
    return f"calls `{name}` (line {call.lineno}), which {why[1]}"


def _carried(m: SemanticModel, loop: ast.For, local: Set[str], scope) -> Optional[ast.Name]:
    """A read in the loop of a name the loop binds that no binding of the same iteration
    comes before (``batch_time.update(time.time() - end); end = time.time()``)."""
    names = [n for n in _walk([loop.target] + list(loop.body)) if isinstance(n, ast.Name) and n.id in local
             and m.scope_of(n) is scope]
    stores: Dict[str, List[ast.Name]] = {}
    for n in names:
        if isinstance(n.ctx, ast.Store):
            stores.setdefault(n.id, []).append(n)
    for r in names:
        reads = isinstance(r.ctx, ast.Load) or isinstance(m.parent(r), ast.AugAssign)
        if reads and not any(_dominates(m, s, r, loop) for s in stores.get(r.id, ())):
            return r
    return None


def _dominates(m: SemanticModel, s: ast.Name, r: ast.Name, within: ast.AST) -> bool:
    """Binding ``s`` runs before read ``r`` on every path through ``within`` (a loop's body)
    that reaches ``r``: ``s`` is the target of a ``for`` whose body holds ``r``, or its
    statement comes before one that holds ``r`` in the same block."""
    if s is r:
        return False
    st = m.statement_of(s)
    if isinstance(st, (ast.For, ast.AsyncFor)) and m.contains(st.target, s):
        return any(m.contains(b, r) for b in st.body)
    a: Optional[ast.AST] = m.statement_of(r)
    while a is not None and a is not within:
        block = m.block_of(a)  # type: ignore[arg-type]
        if block is not None:
            i = next((k for k, x in enumerate(block[2]) if x is st), None)
            j = next(k for k, x in enumerate(block[2]) if x is a)
            if i is not None and i < j:
                return True
        a = m.parent(a)
        while a is not None and not isinstance(a, ast.stmt):
            a = m.parent(a)
    return False


def _start(m: SemanticModel, loop: ast.For, name: str, scope) -> Optional[Tuple[ast.AST, str]]:
    """Why accumulator ``name`` is not a number or a zero tensor before the loop (else None)."""
    where, bindings = m.lookup(name, scope)
    if where is not scope:
        return loop, f"`{name}` is not a local of its function"
    before = [b for b in bindings if not m.contains(loop, b.node) and _pos(b.node) < _pos(loop)]
    if not before:
        return loop, f"`{name}` is not bound before the loop"
    for b in before:
        value = _bound_value(m, b)
        if value is None or not _zero_like(m, value):
            shown = f"`{_short(m, value)}`" if value is not None else "something else"
            node = value if value is not None else b.node
            return node, f"`{name}` starts as {shown} (line {node.lineno}), not a number or a zero tensor"
    return None


def _pos(node: ast.AST) -> Tuple[int, int]:
    return (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))


def _bound_value(m: SemanticModel, b) -> Optional[ast.AST]:
    if b.kind == "assign":
        return b.value
    if b.kind == "unpack" and b.target is not None:
        stmt = m.statement_of(b.target)
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Tuple, ast.List)):
            for t in stmt.targets:
                if isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(stmt.value.elts):
                    for el, v in zip(t.elts, stmt.value.elts):
                        if el is b.target:
                            return v
    return None


def _zero_like(m: SemanticModel, value: ast.AST) -> bool:
    """A number, or a tensor made to hold zeros (``torch.zeros(...)``, ``torch.tensor(0.)``)."""
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, (ast.USub, ast.UAdd)):
        value = value.operand
    if isinstance(value, ast.Constant):
        return isinstance(value.value, (int, float)) and not isinstance(value.value, bool)
    if isinstance(value, ast.Call):
        q = m.qualified_names(value.func)
        if q & {"torch.zeros", "torch.zeros_like"}:
            return True
        if q & {"torch.tensor"} and value.args:
            return _zero_like(m, value.args[0])
    return False


class _Reads:
    """Reads of the names a loop binds that may see the loop's last value."""

    def __init__(self, m: SemanticModel, scope, loop: ast.For) -> None:
        self.m, self.scope, self.loop = m, scope, loop
        self.by_name: Dict[str, List[ast.Name]] = {}
        for n in m.nodes(ast.Name):
            if not m.contains(loop, n) and m.lookup(n.id, m.scope_of(n))[0] is scope:
                self.by_name.setdefault(n.id, []).append(n)  # type: ignore[attr-defined]

    def after(self, name: str) -> Optional[ast.Name]:
        m, loop = self.m, self.loop
        names = self.by_name.get(name, [])
        stores = [n for n in names if isinstance(n.ctx, ast.Store)]
        for r in names:
            reads = isinstance(r.ctx, ast.Load) or isinstance(m.parent(r), ast.AugAssign)
            if not reads:
                continue
            if _pos(r) < _pos(loop) and not self._loop_around_both(r):
                continue  # runs before the loop ever has
            if any(self._kills(s, r) for s in stores):
                continue
            return r
        return None

    def _loop_around_both(self, r: ast.AST) -> bool:
        return any(self.m.contains(a, self.loop) for a in self.m.enclosing_loops(r))

    def _kills(self, s: ast.Name, r: ast.Name) -> bool:
        """Store ``s`` is on every path from the loop to read ``r``."""
        m, loop = self.m, self.loop
        if s is r:
            return False
        st = m.statement_of(s)
        if isinstance(st, (ast.For, ast.AsyncFor)) and m.contains(st.target, s):
            return any(m.contains(b, r) for b in st.body) and not m.contains(st, loop)
        a: Optional[ast.AST] = m.statement_of(r)
        while a is not None and not isinstance(a, FUNCTIONS + (ast.Module,)):
            block = m.block_of(a)  # type: ignore[arg-type]
            if block is not None:
                stmts = block[2]
                i = next((k for k, x in enumerate(stmts) if x is st), None)
                j = next(k for k, x in enumerate(stmts) if x is a)
                if i is not None and i < j:
                    return not any(m.contains(x, loop) for x in stmts[i + 1 : j + 1])
            a = m.parent(a)
            while a is not None and not isinstance(a, ast.stmt):
                a = m.parent(a)
        return False


def _unproven_condition(m: SemanticModel, node: ast.AST, depth: int) -> Optional[Tuple[ast.AST, str]]:
    """An ``if``/``while`` around ``node`` (or an early ``return`` before it), in its
    function or around the calls that reach it, whose test may differ between ranks."""
    child = node
    for a in m.ancestors(node):
        if isinstance(a, FUNCTIONS + (ast.Lambda, ast.ClassDef)):
            break
        if isinstance(a, (ast.If, ast.IfExp, ast.While)) and child is not a.test and not same_on_every_rank(m, a.test):
            return a.test, f"it runs under `{_short(m, a.test)}` (line {a.lineno}), which may differ between ranks"
        child = a
    cur: Optional[ast.AST] = m.statement_of(node)
    while cur is not None and not isinstance(cur, FUNCTIONS + (ast.Module, ast.ClassDef)):
        for sib in m.siblings_before(cur):  # type: ignore[arg-type]
            if isinstance(sib, ast.If) and ends_flow(sib) and not same_on_every_rank(m, sib.test):
                return sib.test, f"`{_short(m, sib.test)}` (line {sib.lineno}) may end its function early on some ranks only"
        cur = m.parent(cur)
        while cur is not None and not isinstance(cur, ast.stmt):
            cur = m.parent(cur)
    func = m.enclosing_function(node)
    if func is None:
        return None
    name = func.name  # type: ignore[attr-defined]
    sites = m.call_sites(func)
    if not sites:
        return func, f"`{name}` is not called from this script, so dp2ddp cannot tell that every rank runs it"
    if depth >= MAX_DEPTH:
        return func, f"`{name}` is called too deep for dp2ddp to tell that every rank runs it"
    for s in sites:
        got = _unproven_condition(m, s, depth + 1)
        if got is not None:
            return got
    return None


def same_on_every_rank(m: SemanticModel, expr: ast.AST, depth: int = 0) -> bool:
    """``expr`` has the same value on every rank: built from constants, the script's
    options (``args`` from ``parse_args()``), loop counters over ``range``/``enumerate``,
    and the parameters its callers pass such values for; nothing that mentions the rank."""
    memo = m.cache.setdefault("eval_loops:same", {})
    key = id(expr)
    if key in memo:  # type: ignore[operator]
        return memo[key]  # type: ignore[index]
    memo[key] = False  # type: ignore[index]  # (while being judged: a cycle proves nothing)
    got = depth <= 6 and not mentions_rank(m, expr) and _same(m, expr, depth)
    memo[key] = got  # type: ignore[index]
    return got


def _same(m: SemanticModel, e: ast.AST, depth: int) -> bool:
    same = lambda x: x is None or same_on_every_rank(m, x, depth + 1)  # noqa: E731
    if isinstance(e, ast.Constant):
        return True
    if isinstance(e, ast.Name):
        return _same_name(m, e, depth)
    if isinstance(e, ast.Attribute):
        return same(e.value)
    if isinstance(e, ast.Subscript):
        return same(e.value) and same(e.slice)
    if isinstance(e, ast.Slice):
        return same(e.lower) and same(e.upper) and same(e.step)
    if isinstance(e, (ast.Tuple, ast.List)):
        return all(same(x) for x in e.elts)
    if isinstance(e, ast.BinOp):
        return same(e.left) and same(e.right)
    if isinstance(e, ast.UnaryOp):
        return same(e.operand)
    if isinstance(e, ast.BoolOp):
        return all(same(v) for v in e.values)
    if isinstance(e, ast.Compare):
        return same(e.left) and all(same(c) for c in e.comparators)
    if isinstance(e, ast.IfExp):
        return same(e.test) and same(e.body) and same(e.orelse)
    if isinstance(e, ast.Call):
        q = m.qualified_names(e.func)
        if q and all(x.startswith("builtins.") and x.split(".", 1)[1] in _SAME_BUILTINS for x in q):
            return all(same(a) for a in e.args) and all(same(k.value) for k in e.keywords)
    return False


def _same_name(m: SemanticModel, n: ast.Name, depth: int) -> bool:
    if n.id == "__name__":
        return True
    _, bindings = m.lookup(n.id, m.scope_of(n))
    if not bindings:
        return False
    same = lambda x: same_on_every_rank(m, x, depth + 1)  # noqa: E731
    for b in bindings:
        if b.kind in ("import", "def", "class"):
            continue
        if b.kind == "assign" and b.value is not None:
            v = b.value
            if isinstance(v, ast.Call) and terminal(v.func) == "parse_args":
                continue  # the script's options: the same command line on every rank
            if same(v):
                continue
            return False
        if b.kind == "augassign" and isinstance(b.node, ast.AugAssign) and same(b.node.value):
            continue
        if b.kind == "for" and b.target is not None:
            loop = m.statement_of(b.target)
            if isinstance(loop, ast.For) and _counter(m, loop, b.target):
                continue
            return False
        if b.kind == "param" and isinstance(b.scope.node, FUNCTIONS):
            func = b.scope.node
            sites = m.call_sites(func)
            if not sites:
                return False
            default = _default(func, n.id)
            for call in sites:
                arg = m.argument_for(func, call, n.id)
                if arg is None and (default is None or not same(default)):
                    return False
                if arg is not None and not same(arg):
                    return False
            continue
        return False
    return True


def _counter(m: SemanticModel, loop: ast.For, target: ast.Name) -> bool:
    """``target`` counts the loop's iterations: ``for epoch in range(...)`` or the index of
    ``enumerate(...)`` (the same at each iteration on every rank, where every rank runs the
    loop the same number of times, as DDP training needs)."""
    it = loop.iter
    if target is loop.target and isinstance(it, ast.Call) and terminal(it.func) in ("range", "trange"):
        return all(same_on_every_rank(m, a) for a in it.args)
    t = loop.target
    return (isinstance(it, ast.Call) and terminal(it.func) == "enumerate" and isinstance(t, ast.Tuple)
            and bool(t.elts) and t.elts[0] is target)


def _default(func: ast.AST, name: str) -> Optional[ast.AST]:
    a = func.args  # type: ignore[attr-defined]
    positional = a.posonlyargs + a.args
    for p, d in zip(positional[len(positional) - len(a.defaults):], a.defaults):
        if p.arg == name:
            return d
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        if p.arg == name:
            return d
    return None
