"""Random numbers a training step draws per sample, outside the model.

DataParallel runs one process: a GAN's ``noise = torch.randn(b_size, nz, 1, 1)`` in the
training loop draws one vector per item of the global batch, and the scatter hands each
replica its rows. Under DDP every rank runs that line with its own share's ``b_size``,
from a random stream seeded alike on every rank: each rank draws the *same* vectors, and
the global batch holds world-size copies of half the noise (measured on the resumed DCGAN
of the survey: the losses leave the original's by more than per-rank BatchNorm explains).

:func:`per_sample_draws` finds, in each training loop of the module (the loop's own
statements, not the model's forward: a draw inside ``forward`` ran on every replica under
DataParallel too), the calls of ``torch.randn``/``rand``/``randint`` whose first size
dimension is the size of a value the step makes (``x.size(0)``, ``x.shape[0]``,
``len(x)``, or a name bound to one of them in the loop). The migration then draws the
whole global batch's rows on every rank from the same stream, and keeps this rank's
(``codemods/rank_noise.py``): each rank's rows are the original's, the streams stay
alike on every rank (so random choices that steer control flow still agree), and nothing
else changes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Set, Tuple

from dp2ddp.model.call_args import argument
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.batch_shapes import batch_value
from dp2ddp.model.flow import origins
from dp2ddp.model.steps import names_bound, own_nodes
from dp2ddp.model.syntax import first_dim_of
from dp2ddp.model.training import training_loops

# the draws whose size the migration can read: ``randn(*size)``, ``rand(*size)``, ``randint([low,] high, size)``
_DRAWS = ("torch.randn", "torch.rand", "torch.randint")
# NumPy's: where the size argument stands, and the dimensions-as-arguments ones
_NP_SIZE_AT = {"uniform": 2, "normal": 2, "randint": 2, "standard_normal": 0, "random": 0, "random_sample": 0,
               "laplace": 2, "logistic": 2, "lognormal": 2, "beta": 2, "binomial": 2, "choice": 1,
               "poisson": 1, "exponential": 1, "gamma": 2}
_NP_DIMS = ("rand", "randn")
# any draw of a random stream (a draw inside a loop over the items of a batch)
_STREAMS = ("torch.", "numpy.random.", "random.")
_STREAM_CALLS = frozenset({"randn", "rand", "randint", "randn_like", "rand_like", "randint_like", "normal", "uniform",
                           "bernoulli", "multinomial", "randperm", "random", "choice", "shuffle", "sample", "gauss",
                           "standard_normal", "random_sample", "beta", "binomial", "poisson", "laplace", "exponential"})


@dataclass(frozen=True)
class Draw:
    call: ast.Call  # the draw, e.g. ``torch.randn(b_size, nz, 1, 1, device=device)``
    count: Optional[ast.AST]  # its first size dimension, the per-sample count (``b_size``); None for
    # a draw shaped like a batch tensor (``torch.randn_like(img)``, ``torch.randn(img.size())``,
    # ``torch.FloatTensor(img.size()).normal_(0, s)``): its rows cannot be counted in the call
    loop: ast.AST  # the training loop whose step draws it
    tensor: bool = True  # a torch tensor (``.chunk`` splits it); False: a NumPy array


def per_sample_draws(m: SemanticModel) -> List[Draw]:
    got = m.cache.get("noise:draws")
    if got is None:
        got, seen = [], set()
        for loop in training_loops(m):
            bound = names_bound(m, loop)
            for n in own_nodes(m, loop):
                if not isinstance(n, ast.Call) or id(n) in seen:
                    continue
                count = _count(m, n)
                if count is not None and _per_step(m, count, bound):
                    seen.add(id(n))
                    got.append(Draw(n, count, loop))
                    continue
                count = _numpy_count(m, n)
                if count is not None and _per_step(m, count, bound):
                    seen.add(id(n))
                    got.append(Draw(n, count, loop, tensor=False))
                elif _shaped_like_batch(m, n, loop):
                    seen.update(id(c) for c in ast.walk(n))
                    got.append(Draw(n, None, loop))
        m.cache["noise:draws"] = got
    return got  # type: ignore[return-value]


_LIKE = ("torch.randn_like", "torch.rand_like", "torch.randint_like")
_SHAPED = ("torch.randn", "torch.rand")
_IN_PLACE = frozenset({"normal_", "uniform_", "bernoulli_", "random_", "exponential_", "log_normal_", "cauchy_"})
_NEW = frozenset({"zeros_like", "empty_like", "ones_like", "FloatTensor", "Tensor", "empty", "zeros", "ones",
                  "new", "new_empty", "new_zeros", "new_ones", "new_tensor"})
def _shaped_like_batch(m: SemanticModel, call: ast.Call, loop: ast.AST) -> bool:
    """A draw shaped like a tensor of the step's batch: ``torch.randn_like(img)``,
    ``torch.randn(img.size())``/``(img.shape)``/``(*img.shape)``, or an in-place draw on a
    fresh tensor of that shape (``torch.FloatTensor(img.size()).normal_(0, s)``,
    ``torch.zeros_like(img).uniform_()``, ``img.new(img.size()).normal_()``)."""
    f = call.func
    q = m.qualified_names(f)
    size = _numpy_size(m, call)
    if size is not None:  # ``np.random.binomial(1, p, x.shape)``, ``np.random.rand(*x.shape)``
        return _shape_of_batch(m, size, loop)
    helper = m.resolve_call(call)
    if helper is not None and loop is not None:
        return _draws_shaped_like(m, call, helper, loop)
    if q & set(_LIKE):
        return bool(call.args) and batch_value(m, call.args[0], loop)
    if q & set(_SHAPED):
        return len(call.args) == 1 and _shape_of_batch(m, call.args[0], loop)
    if isinstance(f, ast.Attribute) and f.attr in _IN_PLACE and isinstance(f.value, ast.Call):
        made = f.value
        name = made.func.attr if isinstance(made.func, ast.Attribute) else getattr(made.func, "id", None)
        if name not in _NEW:
            return False
        if name.endswith("_like"):
            return bool(made.args) and batch_value(m, made.args[0], loop)
        return len(made.args) == 1 and _shape_of_batch(m, made.args[0], loop)
    return False


def _numpy_size(m: SemanticModel, call: ast.Call) -> Optional[ast.AST]:
    """The whole size argument of a NumPy draw (``size=x.shape``, ``rand(*x.shape)``)."""
    names = m.qualified_names(call.func)
    if len(names) != 1 or not next(iter(names)).startswith("numpy.random."):
        return None
    fn = next(iter(names))[len("numpy.random."):]
    if fn in _NP_DIMS:
        starred = [a for a in call.args if isinstance(a, ast.Starred)]
        return starred[0] if len(call.args) == 1 and starred else None
    if fn not in _NP_SIZE_AT:
        return None
    return argument(call, tuple(f"_{i}" for i in range(_NP_SIZE_AT[fn])) + ("size",), "size")


def _draws_shaped_like(m: SemanticModel, call: ast.Call, helper: ast.AST, loop: ast.AST) -> bool:
    """``mask_generator(p, x_batch)`` where the script's function does nothing but return a
    draw shaped like its parameter (``return np.random.binomial(1, p, x.shape)``): drawn
    world-size times at the call, it keeps no state and writes nothing."""
    body = [s for s in getattr(helper, "body", []) if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return False
    for n in ast.walk(body[0].value):
        if not isinstance(n, ast.Call):
            continue
        size = _numpy_size(m, n)
        if size is None and m.qualified_names(n.func) & set(_SHAPED) and len(n.args) == 1:
            size = argument(n, ("size",), "size")
        owner = _shape_owner(size)
        if isinstance(owner, ast.Name) and owner.id in m.params(helper):
            arg = m.argument_for(helper, call, owner.id)
            if arg is not None and batch_value(m, arg, loop):
                return True
    return False


def _shape_of_batch(m: SemanticModel, e: ast.AST, loop: ast.AST) -> bool:
    owner = _shape_owner(e)
    return owner is not None and batch_value(m, owner, loop)


def _shape_owner(e: Optional[ast.AST]) -> Optional[ast.AST]:
    """``x`` of ``x.shape``, ``x.size()`` (or ``*x.shape``): the tensor a size is the shape of."""
    if isinstance(e, ast.Starred):
        e = e.value
    if isinstance(e, ast.Attribute) and e.attr == "shape":
        return e.value
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "size" and not e.args:
        return e.func.value
    return None


def _count(m: SemanticModel, call: ast.Call) -> Optional[ast.AST]:
    """The first size dimension of a draw, where the call spells it plainly."""
    q = m.qualified_names(call.func) & set(_DRAWS)
    if not q or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    size = next((k.value for k in call.keywords if k.arg == "size"), None)
    if size is None:
        if q == {"torch.randint"}:  # randint(high, size) / randint(low, high, size)
            size = call.args[-1] if len(call.args) in (2, 3) else None
        elif call.args:
            size = call.args[0]
            if not isinstance(size, (ast.Tuple, ast.List)):  # randn(n, c, h, w)
                return size
    if isinstance(size, (ast.Tuple, ast.List)) and size.elts and not isinstance(size.elts[0], ast.Starred):
        return size.elts[0]
    return None


def _numpy_count(m: SemanticModel, call: ast.Call) -> Optional[ast.AST]:
    """The first size dimension of a NumPy draw (``np.random.uniform(0, 55, size=n)``,
    ``np.random.randn(n, 3)``), where the call spells it plainly."""
    names = m.qualified_names(call.func)
    if len(names) != 1 or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    (q,) = names
    if not q.startswith("numpy.random."):
        return None
    if q[len("numpy.random."):] in _NP_DIMS:
        return call.args[0] if call.args else None
    size = _numpy_size(m, call)
    if isinstance(size, (ast.Tuple, ast.List)):
        size = size.elts[0] if size.elts and not isinstance(size.elts[0], ast.Starred) else None
    return size


def draws_per_item(m: SemanticModel) -> List[Tuple[ast.AST, ast.Call]]:
    """Random draws in a loop over the items of a training step's batch (``for n in
    range(noise.size(0)): noise[n] = torch.FloatTensor(s).normal_(0, std[n])``), outside the
    model: ``(the item loop, its first draw)``. Under DDP the loop runs over the rank's share
    and the ranks' streams are alike, so every rank draws the same numbers for its items;
    nothing here can hand each rank the original's (it would have to skip the other ranks'
    draws first)."""
    got = m.cache.get("noise:per_item")
    if got is None:
        got, seen = [], set()
        for loop in training_loops(m):
            bound = names_bound(m, loop)
            for n in own_nodes(m, loop):
                if id(n) in seen:
                    continue  # an item loop of a step the epoch loop holds too
                seen.add(id(n))
                if not (isinstance(n, ast.For) and isinstance(n.iter, ast.Call) and m.is_name(n.iter.func, {"builtins.range", "range"})
                        and len(n.iter.args) == 1 and _per_step(m, n.iter.args[0], bound)):
                    continue
                draw = next((c for c in ast.walk(n) if isinstance(c, ast.Call) and _draws(m, c)), None)
                if draw is not None:
                    got.append((n, draw))
        m.cache["noise:per_item"] = got
    return got  # type: ignore[return-value]


def _draws(m: SemanticModel, call: ast.Call) -> bool:
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr in _IN_PLACE:
        return True
    return any(q.startswith(_STREAMS) and q.rsplit(".", 1)[1] in _STREAM_CALLS for q in m.qualified_names(f))


def _size_of_step_value(m: SemanticModel, e: ast.AST, bound: Set[str]) -> bool:
    """``x.size(0)``, ``x.size()[0]``, ``x.shape[0]``, ``len(x)`` of a name the loop binds."""
    target = first_dim_of(e)
    if target is not None and isinstance(e, ast.Call) and isinstance(e.func, ast.Name):
        if not m.qualified_names(e.func) <= {"len", "builtins.len"}:
            return False  # a ``len`` of the script's own
    while isinstance(target, ast.Subscript):  # data[0].size(0)
        target = target.value
    return isinstance(target, ast.Name) and target.id in bound


def _per_step(m: SemanticModel, count: ast.AST, bound: Set[str]) -> bool:
    if _size_of_step_value(m, count, bound):
        return True
    if isinstance(count, ast.Name) and count.id in bound:
        made = origins(m, count)
        return bool(made) and all(not path and _size_of_step_value(m, node, bound) for node, path in made)
    return False


def batch_permutations(m: SemanticModel) -> List[ast.Call]:
    """``torch.randperm(x.size(0))`` (or of a name bound to a batch's first dimension) in a
    function of a module that trains: mixup's and CutMix's ``index``, pairing every sample
    with another of the same batch. Under DDP the batch is the rank's share, so the pairs
    come from that share: the same training in law, not the original's numbers. A
    Dataset's or Sampler's permutation (in a class that defines ``__getitem__`` or
    ``__iter__``) shuffles data, not a batch: left out."""
    got = m.cache.get("noise:perms")
    if got is None:
        got = []
        for call in m.calls(frozenset({"torch.randperm"})):
            if not call.args or _in_data_class(m, call):
                continue
            size = call.args[0]
            if isinstance(size, ast.Name):
                bound = [b.value for b in m.bindings_of(size) if b.kind == "assign" and b.value is not None]
                size = bound[0] if len(bound) == 1 else size
            if first_dim_of(size) is not None and not _sliced(m, call):
                got.append(call)
        m.cache["noise:perms"] = got
    return got  # type: ignore[return-value]


def _sliced(m: SemanticModel, call: ast.Call) -> bool:
    """The permutation is cut into slices (``idx = perm[start:start + bs]``): a shuffle of
    the whole data batched by hand, not a pairing within a batch."""
    stmt = m.parent(call)
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return False
    name = stmt.targets[0].id
    scope = m.enclosing_function(call) or m.tree
    return any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == name
               and isinstance(n.slice, ast.Slice) for n in ast.walk(scope))


def _in_data_class(m: SemanticModel, node: ast.AST) -> bool:
    for a in m.ancestors(node):
        if isinstance(a, ast.ClassDef):
            names = {f.name for f in a.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            return bool(names & {"__getitem__", "__iter__", "__len__"})
    return False


# random generators an object may keep for itself, seeded once: alike on every rank
_OWN_STREAMS = frozenset({"numpy.random.RandomState", "numpy.random.default_rng", "numpy.random.Generator",
                          "random.Random", "torch.Generator"})


def kept_stream_draws(m: SemanticModel) -> List[Tuple[ast.Call, str]]:
    """Calls in a training loop of a method of an object (of the script's or a project
    module's class) that draws from a random generator the object keeps
    (``self.random_state = np.random.RandomState(1234)``), handed the step's batch or its
    size (``mixup.get_lambda(batch_size=len(x))``, audioset's mixup): ``(the call, where the
    generator is made)``. Under DDP every rank's object holds the same generator, so every
    rank draws the same numbers for its share's items; the migration cannot reach a stream
    the object keeps (nor skip the other ranks' draws without knowing how many it makes)."""
    from dp2ddp.model.project_defs import class_of_call, method_of
    from dp2ddp.model.steps import binding_values
    from dp2ddp.model.stores import attribute_assignments

    got = m.cache.get("noise:kept")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.Call, str]] = []
    for loop in training_loops(m):
        bound = names_bound(m, loop)
        for n in own_nodes(m, loop):
            if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and isinstance(n.func.value, (ast.Name, ast.Attribute))):
                continue
            handed = [*n.args, *(k.value for k in n.keywords)]
            if not any(_size_of_step_value(m, a, bound) or batch_value(m, a, loop) for a in handed):
                continue
            for made in binding_values(m, n.func.value) or []:
                found = class_of_call(m, made) if isinstance(made, ast.Call) else None
                if found is None:
                    continue
                cm, cls, where = found
                got = method_of(cm, cls, n.func.attr, where)  # its own, or a base class's
                if got is None:
                    continue
                method = got[1]
                streams = {attr: v for attr, values in attribute_assignments(cm, cls).items() for v in values
                           if isinstance(v, ast.Call) and cm.qualified_names(v.func) & _OWN_STREAMS}
                read = next((streams[x.attr] for x in ast.walk(method) if isinstance(x, ast.Attribute)
                             and isinstance(x.value, ast.Name) and x.value.id == "self" and x.attr in streams), None)
                if read is not None:
                    out.append((n, f"{where}:{read.lineno}" if where else f"line {read.lineno}"))
                    break
    m.cache["noise:kept"] = out
    return out


_SEEDS = frozenset({"numpy.random.seed", "random.seed", "torch.manual_seed", "torch.random.manual_seed"})
_WORKER_INFO = frozenset({"torch.utils.data.get_worker_info"})


def worker_id_seeds(m: SemanticModel) -> List[Tuple[ast.Call, str]]:
    """Seeds a dataset's ``__getitem__``/``__iter__`` gives the random streams from the
    DataLoader worker's id alone (``np.random.seed(get_worker_info().id)``, RAFT's datasets),
    in this module or a project module it calls into: ``(the script's call that reaches it,
    or the seed itself when it is this module's; where)``. Under DDP every rank's worker
    ``k`` seeds alike after whatever the migration gave it, so every rank draws the same
    augmentations."""
    from dp2ddp.model.project_defs import project_calls

    got = m.cache.get("noise:worker_seeds")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.Call, str]] = []
    seen = set()
    modules = [(m, None, "")] + [(pm, call, rel) for call, (pm, _, rel) in project_calls(m)]
    for pm, call, rel in modules:
        if id(pm) in seen:
            continue
        seen.add(id(pm))
        seed = _worker_id_seed(pm)
        if seed is not None:
            out.append((call if call is not None else seed, f"{rel}:{seed.lineno}" if rel else f"line {seed.lineno}"))
    m.cache["noise:worker_seeds"] = out
    return out


def _worker_id_seed(pm: SemanticModel) -> Optional[ast.Call]:
    for func in pm.nodes(ast.FunctionDef):
        if func.name not in ("__getitem__", "__iter__", "__getitems__"):
            continue
        infos = {t.id for n in ast.walk(func) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                 and pm.qualified_names(n.value.func) & _WORKER_INFO
                 for t in n.targets if isinstance(t, ast.Name)}
        for n in ast.walk(func):
            if not (isinstance(n, ast.Call) and pm.qualified_names(n.func) & _SEEDS):
                continue
            for a in ast.walk(n):
                if (isinstance(a, ast.Attribute) and a.attr == "id" and (
                        isinstance(a.value, ast.Name) and a.value.id in infos
                        or isinstance(a.value, ast.Call) and pm.qualified_names(a.value.func) & _WORKER_INFO)):
                    return n
    return None
