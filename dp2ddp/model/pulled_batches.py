"""Batches a training loop pulls from something that is not a loader dp2ddp can shard.

A training loop over a count (``for it in range(iters):``, ``while True:``) gets its batch
inside the body. Loaders reached there (``next(it)`` of a DataLoader's iterator,
``holder.get_batch()``) are :func:`dp2ddp.model.training_feeds.fed_values`; batches cut by index
(``x[i:i + bs]``) are :func:`dp2ddp.model.batches.hand_loops`. What is left feeds the
forward from a call of another kind: a function that draws its batch at random
(``get_batch(split)`` indexing a corpus at ``torch.randint`` positions), a method of an
object dp2ddp cannot read (``sess.run(train_iter)`` of a TensorFlow pipeline,
``provider.next()``), a function of another module. Under DataParallel the one process
pulled one batch per step and split it between the GPUs; under DDP every rank would pull
a whole batch of its own — the same one where the streams agree (every rank doing all the
work) or another one (the global batch times the world size). :func:`pulled_batches`
finds them, one per loop, for the loader migration to refuse.

What is not a pull: tensors made in the step by ``torch``/``numpy`` themselves (noise,
synthetic inputs: the random-draw migration's business), values from outside the loop
(the same tensor every step), the loop's own counter, literals.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Set

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.steps import backward_calls, innermost_loop, own_nodes
from dp2ddp.model.syntax import root_name, terminal

# methods of a tensor or an array that hand on the data they are called on
_CARRYING = frozenset({
    "cuda", "to", "cpu", "float", "double", "half", "bfloat16", "long", "int", "bool", "byte", "type", "view",
    "reshape", "permute", "transpose", "contiguous", "unsqueeze", "squeeze", "flatten", "detach", "clone",
    "requires_grad_", "pin_memory", "astype", "numpy", "copy", "expand", "repeat", "t", "float32", "item",
    "view_as", "reshape_as", "type_as", "non_blocking", "split", "chunk", "narrow", "index_select",
})
# methods that fetch the next batch from an object that holds the data (a TensorFlow
# session's ``run``, a provider's ``next``, a queue's ``get``)
_FETCHING = frozenset({"run", "next", "__next__", "get_next", "next_batch", "get_batch", "sample_batch", "fetch",
                       "get", "batch", "take", "sample", "read"})
# library roots whose calls make or reshape tensors rather than fetch a batch
_TENSOR_LIBRARIES = ("torch.", "numpy.", "math.", "builtins.", "random.")
# draws of random positions: a batch indexed by one of them is sampled in the step
_DRAWS = frozenset({"randint", "randperm", "choice", "permutation", "sample", "multinomial", "shuffle", "randrange"})


@dataclass
class Pulled:
    loop: ast.AST  # the training loop
    forward: ast.Call  # the forward of the wrapped model the batch feeds
    source: ast.AST  # the call (or the indexing) that makes the batch
    how: str  # "drawn" (indexed at random positions) or "pulled" (a call dp2ddp cannot read)


def _is_count_loop(loop: ast.AST) -> bool:
    """A loop over a count: ``while``, ``for _ in range(...)`` (through ``tqdm``/
    ``enumerate``), ``itertools.count()``."""
    if isinstance(loop, ast.While):
        return True
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    it = loop.iter
    while isinstance(it, ast.Call) and terminal(it.func) in ("tqdm", "enumerate", "trange") and it.args:
        if terminal(it.func) == "trange":
            return True
        it = it.args[0]
    return isinstance(it, ast.Call) and terminal(it.func) in ("range", "count")


def _library_call(m: SemanticModel, call: ast.Call) -> bool:
    names = m.qualified_names(call.func)
    return bool(names) and all(n.startswith(_TENSOR_LIBRARIES) or n in ("len", "int", "float", "list", "tuple", "zip")
                               for n in names)


def pulled_batches(m: SemanticModel) -> List[Pulled]:
    """The training loops over a count whose forward is fed a batch pulled from a call dp2ddp
    cannot shard (see the module docstring); one per loop."""
    from dp2ddp.model.batches import hand_loops, trained_forwards
    from dp2ddp.model.training import updates
    from dp2ddp.model.training_feeds import NOT_DATA, fed_values

    got = m.cache.get("pulled-batches")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Pulled] = []
    fed = {id(loop) for v, loop in fed_values(m)
           if not (isinstance(v, ast.Call) and terminal(v.func) in NOT_DATA)}  # a count is no loader
    cut = {id(h.loop) for h in hand_loops(m)}
    loops: List[ast.AST] = []
    for b in backward_calls(m):
        loop = innermost_loop(m, b)
        if loop is not None and all(loop is not x for x in loops):
            loops.append(loop)
    for loop in loops:
        if id(loop) in fed or id(loop) in cut or not _is_count_loop(loop) or not updates(m, loop):
            continue
        forwards = trained_forwards(m, loop)
        for forward, _ in forwards:
            found = _source(m, loop, forward)
            if found is not None:
                out.append(Pulled(loop, forward, found[0], found[1]))
                break
        if not forwards:
            unpacked = _unpacked_pull(m, loop)
            if unpacked is not None:
                out.append(Pulled(loop, unpacked, unpacked, "pulled"))
    m.cache["pulled-batches"] = out
    return out


def _unpacked_pull(m: SemanticModel, loop: ast.AST) -> Optional[ast.Call]:
    """Where the module wraps no model it trains (a project's trainer, handed the wrapper:
    no forward of a wrap to follow), a batch unpacked in the loop's own pass from a fetch of
    an object that holds the data: ``inputs, targets, lengths = queue.get()`` (kospeech's
    trainer, fed by its own loader threads), ``x, y = provider.next_batch()``. Two names or
    more at once, a batch's fields, not a setting read from a dict."""
    for n in own_nodes(m, loop):
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], (ast.Tuple, ast.List))
                and len(n.targets[0].elts) >= 2 and isinstance(n.value, ast.Call) and innermost_loop(m, n) is loop):
            continue
        f = n.value.func
        if (isinstance(f, ast.Attribute) and f.attr in _FETCHING and m.resolve_call(n.value) is None
                and not _library_call(m, n.value) and not _holds_a_loader(m, f.value)):
            return n.value
    return None


def _source(m: SemanticModel, loop: ast.AST, forward: ast.Call):
    """(the expression that pulls the forward's batch, how) or None."""
    counter = ({n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
               if isinstance(loop, (ast.For, ast.AsyncFor)) else set())

    def of_expr(e: ast.AST, seen: Set[str]):
        if isinstance(e, ast.Name):
            return of_name(e, seen)
        if isinstance(e, ast.Attribute):
            return of_expr(e.value, seen) if isinstance(e.value, (ast.Name, ast.Call, ast.Subscript, ast.Attribute)) else None
        if isinstance(e, ast.Subscript):
            drawn = _drawn_index(m, loop, e.slice)
            if drawn is not None:
                return e, "drawn"
            return of_expr(e.value, seen)
        if isinstance(e, ast.Call):
            return of_call(e, seen)
        for c in ast.iter_child_nodes(e):
            if isinstance(c, ast.expr):
                got = of_expr(c, seen)
                if got is not None:
                    return got
        return None

    def of_call(call: ast.Call, seen: Set[str]):
        parts = [a.value if isinstance(a, ast.Starred) else a for a in call.args] + [k.value for k in call.keywords]
        if _library_call(m, call) or (isinstance(call.func, ast.Name) and call.func.id in ("Variable", "next")):
            if isinstance(call.func, ast.Name) and call.func.id == "next":
                return None  # an iterator of what fed_values did not trace: not this fact's business
            for p in parts:
                got = of_expr(p, seen)
                if got is not None:
                    return got
            return None
        if isinstance(call.func, ast.Attribute) and call.func.attr in _CARRYING:
            return of_expr(call.func.value, seen)
        func = m.resolve_call(call)
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if _draws_positions(m, func):
                return call, "drawn"
            if _fetches(m, func):
                return call, "pulled"
        elif isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and call.func.value.id == "self":
            return None  # a method of the class the loop is in: read by the project's own facts
        elif func is None and isinstance(call.func, ast.Attribute) and _a_module(m, call.func.value):
            return call, "pulled"  # a function of another module (``pipeline.fetch(it)``)
        elif isinstance(call.func, ast.Attribute) and call.func.attr in _FETCHING:
            if _holds_a_loader(m, call.func.value):
                return None  # ``prefetcher.next()`` of ``data_prefetcher(train_loader)``: the loader is sharded
            return call, "pulled"  # a method of an object the data is in (``sess.run(train_iter)``)
        for p in parts:  # a value made from the batch (``process_data(sess.run(it))``)
            got = of_expr(p, seen)
            if got is not None:
                return got
        return None

    def of_name(name: ast.Name, seen: Set[str]):
        if name.id in counter or name.id in seen:
            return None
        seen = seen | {name.id}
        _, bindings = m.lookup(name.id, m.scope_of(name))
        inside = [b for b in bindings if m.contains(loop, b.node) and b.node is not loop]
        for b in inside:
            stmt = b.node if isinstance(b.node, ast.stmt) else m.statement_of(b.node)
            if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
                return None  # bound some other way (a for target, a with): not followed
            got = of_expr(stmt.value, seen)
            if got is not None:
                return got
        for n in own_nodes(m, loop):  # filled in place: ``data[i] = x`` of a tensor made before
            if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name.id for t in n.targets
            ):
                got = of_expr(n.value, seen)
                if got is not None:
                    return got
        return None

    for a in list(forward.args) + [k.value for k in forward.keywords]:
        got = of_expr(a.value if isinstance(a, ast.Starred) else a, set())
        if got is not None:
            return got
    return None


def _a_module(m: SemanticModel, expr: ast.AST) -> bool:
    """``pipeline`` of ``import pipeline`` (or ``a.b`` of ``import a.b``): a module, not an
    object."""
    root = root_name(expr)
    return root is not None and m.is_imported(root) and not root.id[:1].isupper()  # (``Foo.load()``: a class)


def _holds_a_loader(m: SemanticModel, receiver: ast.AST) -> bool:
    """An object made from a DataLoader (``prefetcher = data_prefetcher(train_loader)``):
    its batches are the loader's, which the loader migration shards."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.loaders import loaders
    from dp2ddp.model.names import DATALOADER

    made = {id(ld.call) for ld in loaders(m)}

    def a_loader(expr: ast.AST) -> bool:
        return any(id(n) in made or (isinstance(n, ast.Call) and m.call_is(n, DATALOADER)) for n, _ in origins(m, expr))

    for node, _ in origins(m, receiver):
        if isinstance(node, ast.Call) and any(
            a_loader(a.value if isinstance(a, (ast.Starred, ast.keyword)) else a) for a in list(node.args) + list(node.keywords)
        ):
            return True
    return False


def _drawn_index(m: SemanticModel, loop: ast.AST, index: ast.AST) -> Optional[ast.AST]:
    """The random draw behind an index (``x[idx]`` with ``idx = torch.randint(...)`` in the
    loop, or drawn in place)."""
    for n in ast.walk(index):
        if isinstance(n, ast.Call) and terminal(n.func) in _DRAWS and _library_call(m, n):
            return n
        if isinstance(n, ast.Name):
            _, bindings = m.lookup(n.id, m.scope_of(n))
            for b in bindings:
                if m.contains(loop, b.node) and b.kind == "assign" and b.value is not None and any(
                    isinstance(c, ast.Call) and terminal(c.func) in _DRAWS and _library_call(m, c) for c in ast.walk(b.value)
                ):
                    return b.value
    return None


def _draws_positions(m: SemanticModel, func: ast.AST) -> bool:
    """A function of this module that indexes data at random positions it draws
    (``ix = torch.randint(len(data) - block, (bs,))`` then ``data[i:i + block] for i in ix``)."""
    for n in ast.walk(func):
        if isinstance(n, ast.Call) and terminal(n.func) in _DRAWS and _library_call(m, n):
            return any(isinstance(s, ast.Subscript) for s in ast.walk(func))
    return False


def _fetches(m: SemanticModel, func: ast.AST) -> bool:
    """A function of this module whose result comes from a call dp2ddp cannot read (another
    module's, an object's method): ``def fetch(it): return next(it)`` is not (an iterator
    passed in), ``def batch(): return sess.run(op)`` is."""
    for n in own_nodes(m, func):
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Call):
            c = n.value
            if isinstance(c.func, ast.Attribute) and c.func.attr not in _CARRYING and not _library_call(m, c):
                return True
    return False
