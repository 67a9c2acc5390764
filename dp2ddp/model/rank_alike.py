"""Values that are the same on every rank: :func:`same_on_every_rank`.

A condition built only from such values takes the same branch on every rank, so the code
under it runs the same number of times everywhere (what a collective, or a sharded
evaluation loop, needs): constants, the script's options (``args`` from ``parse_args()``),
counters of loops over ``range``/``enumerate``, the size of a torchvision dataset made
from such values, and the parameters every caller passes such values for; never anything
that mentions the rank (:func:`dp2ddp.model.ranks.mentions_rank`).
"""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.call_args import LOAD_PARAMS, argument
from dp2ddp.model.names import LOAD
from dp2ddp.model.ranks import mentions_rank
from dp2ddp.model.syntax import FUNCTIONS, terminal


# builtins whose value is the same wherever its arguments are
_SAME_BUILTINS = frozenset({"len", "int", "float", "abs", "min", "max", "round", "bool", "str", "range", "isinstance",
                            "sorted", "list", "tuple", "reversed",
                            "hasattr", "getattr", "sum", "any", "all"})


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
    if _dataset_size(m, e, depth):
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
        if q and q <= LOAD:
            # a checkpoint read from a path that is the same on every rank: the same file (a write
            # of it in this run is followed by a barrier before any rank reads it: write_barriers)
            f = argument(e, LOAD_PARAMS, "f")
            return f is not None and same(f)
    return False


def _dataset_size(m: SemanticModel, e: ast.AST, depth: int) -> bool:
    """How many samples a torchvision dataset holds: ``len(ds)``, ``ds.data.size(0)``,
    ``ds.data.shape[0]`` (MNIST's and CIFAR's tensors or arrays of samples)."""
    if isinstance(e, ast.Call) and m.qualified_names(e.func) == {"builtins.len"} and len(e.args) == 1 and not e.keywords:
        return _library_dataset(m, e.args[0], depth)
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "size":
        base, ok = e.func.value, all(same_on_every_rank(m, a, depth + 1) for a in e.args) and not e.keywords
    elif isinstance(e, ast.Subscript) and isinstance(e.value, ast.Attribute) and e.value.attr == "shape":
        base, ok = e.value.value, same_on_every_rank(m, e.slice, depth + 1)
    else:
        return False
    return ok and isinstance(base, ast.Attribute) and base.attr == "data" and _library_dataset(m, base.value, depth)


# a library dataset's keywords that change its items, not how many there are
_ITEM_KEYWORDS = frozenset({"transform", "target_transform", "transforms", "download", "loader"})


def _library_dataset(m: SemanticModel, e: ast.AST, depth: int) -> bool:
    """A name bound only to torchvision datasets made from values the same on every rank
    (their transforms aside): its ``len()`` is the same on every rank (the files it reads are
    the same)."""
    if not isinstance(e, ast.Name):
        return False
    _, bindings = m.lookup(e.id, m.scope_of(e))
    if not bindings:
        return False
    for b in bindings:
        v = b.value if b.kind == "assign" else None
        if not (isinstance(v, ast.Call) and any(x.startswith("torchvision.datasets.") for x in m.qualified_names(v.func))):
            return False
        if not all(same_on_every_rank(m, a, depth + 1) for a in v.args):
            return False
        if not all(k.arg in _ITEM_KEYWORDS or same_on_every_rank(m, k.value, depth + 1) for k in v.keywords):
            return False
    return True


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
            default = m.default_of(func, n.id)
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


# calls that make a name of their own in every process that runs them
PER_PROCESS_PATHS = frozenset({
    "tempfile.mkdtemp", "tempfile.mkstemp", "tempfile.mktemp", "tempfile.NamedTemporaryFile",
    "tempfile.TemporaryDirectory", "tempfile.TemporaryFile", "tempfile.SpooledTemporaryFile",
})


def per_process_path(m: SemanticModel, expr: Optional[ast.AST], depth: int = 0) -> Optional[ast.Call]:
    """The call that makes ``expr`` (a path) a name of this process's own: a temporary folder
    or file (``os.path.join(tempfile.mkdtemp(), "w.pt")``, through names, ``.name``, joins and
    f-strings). Each rank then writes and reads a file of its own, which no other rank sees:
    such a write cannot move to rank 0 alone."""
    from dp2ddp.model.flow import origins

    if expr is None:
        return None
    # breadth-first over the expressions behind the path, each once, six steps deep: a
    # path rebuilt from itself many times (``path = os.path.join(path, x)`` in a loop of
    # branches) once took exponential time walked as a tree
    seen = {id(expr)}
    level = [expr]
    for _ in range(depth, 7):
        following = []
        for e in level:
            for n in ast.walk(e):
                if isinstance(n, ast.Call) and m.qualified_names(n.func) & PER_PROCESS_PATHS:
                    return n
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                    for node, _ in origins(m, n):
                        if node is not n and id(node) not in seen:
                            seen.add(id(node))
                            following.append(node)
        if not following:
            return None
        level = following
    return None
