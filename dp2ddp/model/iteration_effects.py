"""What one iteration of a loop leaves behind: :func:`escape`.

An iteration *escapes* when it leaves a trace outside itself that a sharded run would
change: a ``return``/``break``, a value changed in place that outlives it, a write or a
print (:mod:`dp2ddp.model.writers`), gradients, random draws, a collective, a call whose
effects the model does not follow. The script's own functions are read with the same
rules, :data:`MAX_DEPTH` calls deep. :mod:`dp2ddp.model.eval_loops` asks it of each
evaluation loop.
"""

from __future__ import annotations

import ast
from typing import Dict, FrozenSet, Iterable, Optional, Sequence, Set, Tuple

from dp2ddp.model.collectives import collective_of, is_wrapped_forward
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.kinds import SAME_MODULE
from dp2ddp.model.project_defs import project_def
from dp2ddp.model.syntax import FUNCTIONS, LOOPS
from dp2ddp.model.training import is_backward
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


GRADIENTS = frozenset({"torch.autograd.grad", "torch.autograd.backward"})


MAX_DEPTH = 3


def _origins(m: SemanticModel, expr: ast.AST):
    from dp2ddp.model.flow import origins

    return origins(m, expr)


def walk_statements(stmts: Iterable[ast.AST]) -> Iterable[ast.AST]:
    """Every node of ``stmts``, in source order, not entering nested functions or classes
    (a call of one is read where it is made)."""
    todo = list(reversed(list(stmts)))
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, FUNCTIONS + (ast.ClassDef,)):
            continue
        todo.extend(reversed(list(ast.iter_child_nodes(n))))


def _base(node: ast.AST) -> Optional[ast.Name]:
    """The name an attribute/subscript/call chain starts from (``conf`` of ``conf[t, p]``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node if isinstance(node, ast.Name) else None


def escape(m: SemanticModel, body: Sequence[ast.AST], local: Set[str], accs: Set[str], scope, loop: ast.AST,
            depth: int, collecting: FrozenSet[int] = frozenset()) -> Optional[Tuple[ast.AST, str]]:
    """The first thing in ``body`` that leaves a trace outside one iteration, with what it
    does (``"appends ... (line 12)"``); ``local``: names bound in the loop (or in the
    function read); ``accs``: the accumulators, which only ``+=`` may touch (or, for a
    list, only the ``.append``/``.extend`` calls in ``collecting``, by ``id``; for a zero
    tensor, also the ``acc[i] += ...`` statements there)."""
    writes = {id(w.call): w.kind for w in writers(m)}
    receivers = set()  # the accumulator's own name in an allowed `preds.append(...)` / `total[i] += ...`
    for n in walk_statements(body):
        if id(n) in collecting:
            receivers.add(id(n.func.value) if isinstance(n, ast.Call) else id(n.target.value))  # type: ignore[attr-defined]
    for n in walk_statements(body):
        if id(n) in collecting or id(n) in receivers:
            continue  # a list the loop collects into, an element of a zero tensor it adds to: kept with its batch
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
                            return x, f"changes `{m.brief(x)}` in place {line}, which outlives the loop"
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
        return f"{'prints' if kind == 'print' else 'writes'} (`{m.brief(call)}`)"
    f = call.func
    q = m.qualified_names(f)
    if is_backward(call) or q & GRADIENTS:
        return f"computes gradients (`{m.brief(call)}`)"
    if any(x.startswith(_RANDOM) for x in q) or (isinstance(f, ast.Attribute) and f.attr in _RANDOM_METHODS):
        return f"draws random numbers (`{m.brief(call)}`): each batch would draw other numbers than the original's"
    got = collective_of(m, call)
    if got is not None and got != "DDP forward":
        return f"calls a collective (`{m.brief(call)}`)"
    if any(x.startswith(("sys.stdout", "sys.stderr", "logging.", "warnings.")) for x in q):
        return f"writes (`{m.brief(call)}`)"
    base = _base(f)
    if base is not None and base.id in local:
        return None  # a value of this iteration: `outputs.max(1)`, `pred.eq(y).sum()`
    target = m.resolve_call(call)
    if target is not None:
        if depth >= MAX_DEPTH:
            return f"calls `{m.brief(f)}`, deeper than dp2ddp follows"
        return _function_escape(m, call, target, accs, scope, loop, depth + 1)
    if q and all(x.startswith("builtins.") for x in q):
        names = {x.split(".", 1)[1] for x in q}
        return None if names <= _PURE_BUILTINS else f"calls `{m.brief(f)}`"
    if base is not None and m.is_imported(base):
        if all(x.split(".", 1)[0] in _LIBRARIES for x in q):
            return None  # a library function: torch, F, numpy ...
        if isinstance(f, (ast.Name, ast.Attribute)) and project_def(m, f) is not None:
            return f"calls `{m.brief(f)}` of the project, whose effects dp2ddp does not follow"
        return f"calls `{m.brief(f)}`, whose effects dp2ddp does not follow"
    if isinstance(f, ast.Name):
        return None  # a forward of a value made outside the loop: `model(x)`, `criterion(out, y)`
    if isinstance(f, ast.Attribute):
        if f.attr in _PURE_METHODS or is_wrapped_forward(m, call, dp=True) or _torch_object(m, f):
            return None
        return f"calls `{m.brief(f)}(...)` on a value made outside the loop, which may keep what it is given"
    return None




def _torch_object(m: SemanticModel, f: ast.Attribute) -> bool:
    """``self.criterion`` bound only to torch objects (``nn.CrossEntropyLoss()``): calling
    it is a forward."""
    got = _origins(m, f)
    return bool(got) and all(_torch_made(m, n) for n, _ in got)


def _torch_made(m: SemanticModel, node: ast.AST) -> bool:
    """A call of a torch class or function, placed or not (``nn.Sequential(...).to(device)``)."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SAME_MODULE:
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
    why = escape(m, func.body, local, accs, scope, loop, depth)  # type: ignore[attr-defined]
    if why is None:
        return None
    return f"calls `{name}` (line {call.lineno}), which {why[1]}"
