"""DataLoaders and their samplers: what each ``DataLoader(...)`` call of a module is.

* :func:`loaders`: every ``DataLoader(...)`` call, its arguments read once (dataset,
  batch size, shuffle, sampler — followed through a name (:func:`follow`,
  :func:`sampler_values`) —, batch sampler, workers, the keys of a ``**kwargs`` dict
  (:func:`kwargs_keys`)), why a sampler cannot be added to it, and whether it trains (a
  shuffling or random sampler, or a name that says ``train``: :func:`is_training`; or a
  training loop iterates it: :func:`feeds_training`) or evaluates.
* :func:`distributed_sampler`: a sampler that is (on some path) a ``DistributedSampler``.

Where a loader is iterated and its epoch loops are :mod:`dp2ddp.model.epochs`; loaders made
by a DataLoader subclass or returned by a project function, :mod:`dp2ddp.model.loader_makers`;
an object that holds one and iterates it, :mod:`dp2ddp.model.held_loaders`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Set, Tuple

from dp2ddp.model.call_args import DATALOADER_PARAMS, argument
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.held_loaders import class_holds
from dp2ddp.model.names import DATALOADER, DISTRIBUTED_SAMPLER, ITERABLE_DATASET, RANDOM_SAMPLER, SEQUENTIAL_SAMPLER
from dp2ddp.model.syntax import kwarg, terminal

EVAL_WORDS = ("test", "val", "eval", "dev", "valid", "infer", "predict")


@dataclass
class Loader:
    call: ast.Call
    dataset: Optional[ast.AST]
    batch_size: Optional[ast.AST]
    shuffle: Optional[ast.keyword]
    sampler: Optional[ast.keyword]
    sampler_value: Optional[ast.AST]  # the sampler expression, followed through a local name
    batch_sampler: Optional[ast.keyword]
    num_workers: Optional[ast.keyword]
    target: Optional[ast.AST]  # what the loader is assigned to
    function: Optional[ast.AST]
    label: str
    problem: Optional[str]  # why a sampler cannot be added automatically
    training: bool
    iterable_dataset: bool = False
    kwargs: Optional[ast.AST] = None  # the **dict of the call, when its keys are known
    kwargs_keys: frozenset = frozenset()
    held: bool = False  # held by a class that iterates it: sharded per object (HeldLoader)
    # one loader per key: the element of ``name = {x: DataLoader(...) for x in KEYS}``
    # (``comp``), or one value of a dict literal (``name = {"train": DataLoader(...)}``)
    comp: Optional[ast.DictComp] = None
    keys: Tuple[object, ...] = ()  # the comprehension's keys, or the literal's one key
    train_keys: Tuple[object, ...] = ()  # those whose loader trains
    holder: Optional[ast.AST] = None  # the name the dict is assigned to (``name``)


def assign_target(m: SemanticModel, call: ast.Call) -> Optional[ast.AST]:
    parent = m.parent(call)
    if isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1:
        t = parent.targets[0]
        return t if isinstance(t, (ast.Name, ast.Attribute, ast.Subscript)) else None
    if isinstance(parent, ast.AnnAssign) and parent.value is call:
        return parent.target
    return None


def _keyed(m: SemanticModel, call: ast.Call):
    """``(comp, keys, holder)`` for the DataLoader element of a keyed dict comprehension
    (``{x: DataLoader(sets[x], ...) for x in ["train", "val"]}``), ``(None, (key,),
    holder)`` for a value of a dict literal under a constant key; ``holder`` is the name
    the dict is assigned to, if any. ``None`` otherwise."""
    from dp2ddp.model.flow import comp_keys

    parent = m.parent(call)
    keys: Tuple[object, ...]
    if isinstance(parent, ast.DictComp) and parent.value is call:
        got = comp_keys(m, parent)
        if got is None:
            return None
        comp, keys = parent, got
    elif isinstance(parent, ast.Dict) and any(v is call for v in parent.values):
        k = parent.keys[[id(v) for v in parent.values].index(id(call))]
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            return None
        comp, keys = None, (k.value,)
    else:
        return None
    holder = assign_target(m, parent)  # type: ignore[arg-type]
    return comp, keys, holder if isinstance(holder, (ast.Name, ast.Attribute)) else None


def loader_label(target: Optional[ast.AST], func: Optional[ast.AST], m: SemanticModel) -> str:
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    if isinstance(target, ast.Subscript):
        key = target.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
        return terminal(target.value) or ""
    return getattr(func, "name", "") if func is not None else ""


def follow(m: SemanticModel, expr: ast.AST) -> ast.AST:
    """``sampler=train_sampler``: the value of the one assignment of that name in the same
    scope, else the expression itself."""
    if not isinstance(expr, ast.Name):
        return expr
    _, bindings = m.lookup(expr.id, m.scope_of(expr))
    values = [b.value for b in bindings if b.kind == "assign" and b.value is not None]
    if len(values) == 1 and len(bindings) == 1:
        return values[0]
    if len(values) == len(bindings) and values and all(ast.dump(v) == ast.dump(values[0]) for v in values):
        return values[0]
    return expr


def _iterable_classes(m: SemanticModel) -> Set[str]:
    out = set()
    for cls in m.nodes(ast.ClassDef):
        if any(m.is_name(b, ITERABLE_DATASET) or (isinstance(b, ast.Name) and b.id in out) for b in cls.bases):
            out.add(cls.name)
    return out


def _is_iterable(m: SemanticModel, expr: Optional[ast.AST], classes: Set[str]) -> bool:
    if expr is None:
        return False
    expr = follow(m, expr)
    if isinstance(expr, ast.Call):
        return (isinstance(expr.func, ast.Name) and expr.func.id in classes) or m.is_name(expr.func, ITERABLE_DATASET)
    return False


def kwargs_keys(m: SemanticModel, expr: ast.AST) -> Optional[Set[str]]:
    """The keys a ``**kwargs`` dict may hold, when they are all known: every binding is a
    dict literal (or ``dict(k=v)``) and every change a ``.update`` with such a value or a
    subscript store with a constant key; else ``None``."""
    if not isinstance(expr, ast.Name):
        return None
    where, bindings = m.lookup(expr.id, m.scope_of(expr))
    if where is None or not bindings:
        return None
    keys: Set[str] = set()

    def literal(v: ast.AST, depth: int = 0) -> Optional[Set[str]]:
        if isinstance(v, ast.Dict):
            if any(k is None or not (isinstance(k, ast.Constant) and isinstance(k.value, str)) for k in v.keys):
                return None
            return {k.value for k in v.keys}  # type: ignore[union-attr]
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "dict" and not v.args:
            if any(k.arg is None for k in v.keywords):
                return None
            return {k.arg for k in v.keywords}  # type: ignore[misc]
        if isinstance(v, ast.Name) and depth < 2:
            return kwargs_keys(m, v)
        if isinstance(v, ast.IfExp):
            a, b = literal(v.body, depth), literal(v.orelse, depth)
            return None if a is None or b is None else a | b
        return None

    for b in bindings:
        if b.kind == "param" and isinstance(b.node, ast.arg) and where.kind == "function":
            func = where.node
            if getattr(func.args.kwarg, "arg", None) == expr.id:  # type: ignore[attr-defined]
                # def make_loader(args, **kwargs): the keywords its callers pass
                named = set(m.params(func))
                for call in m.call_sites(func):
                    for k in call.keywords:
                        if k.arg is None:
                            got = literal(k.value, 1)
                            if got is None:
                                return None
                            keys |= got
                        elif k.arg not in named:
                            keys.add(k.arg)
                if not m.call_sites(func):
                    return None
                continue
        got = literal(b.value) if b.kind == "assign" and b.value is not None else None
        if got is None:
            return None
        keys |= got
    for n in m.nodes(ast.Name):
        if n.id != expr.id or not isinstance(n.ctx, ast.Load) or m.lookup(n.id, m.scope_of(n))[0] is not where:
            continue
        parent = m.parent(n)
        if isinstance(parent, ast.Attribute) and parent.value is n:
            call = m.parent(parent)
            if parent.attr == "update" and isinstance(call, ast.Call) and call.func is parent:
                if call.args:
                    got = literal(call.args[0], 1)
                    if got is None:
                        return None
                    keys |= got
                keys |= {k.arg for k in call.keywords if k.arg}
                if any(k.arg is None for k in call.keywords):
                    return None
            elif parent.attr in ("get", "copy", "items", "keys", "values", "pop", "setdefault"):
                continue
            else:
                return None
        elif isinstance(parent, ast.Subscript) and parent.value is n and isinstance(parent.ctx, ast.Store):
            if not (isinstance(parent.slice, ast.Constant) and isinstance(parent.slice.value, str)):
                return None
            keys.add(parent.slice.value)
    return keys


def sampler_values(m: SemanticModel, expr: Optional[ast.AST]) -> List[ast.AST]:
    """What a ``sampler=`` argument may be: the expression, every value assigned to the
    name in its scope (``sampler = None`` / ``sampler = DistributedSampler(ds)``), both
    branches of a conditional expression."""
    if expr is None:
        return []
    if isinstance(expr, ast.IfExp):
        return sampler_values(m, expr.body) + sampler_values(m, expr.orelse)
    if isinstance(expr, ast.Name):
        _, bindings = m.lookup(expr.id, m.scope_of(expr))
        values = [b.value for b in bindings if b.kind == "assign" and b.value is not None]
        if values and len(values) == len(bindings):
            out: List[ast.AST] = []
            for v in values:
                out.extend(sampler_values(m, v) if not isinstance(v, ast.Name) else [v])
            return out
    return [expr]


def distributed_sampler(m: SemanticModel, expr: Optional[ast.AST]) -> bool:
    """A ``DistributedSampler(...)``, or a conditional whose one branch is
    (``RandomSampler(ds) if local_rank == -1 else DistributedSampler(ds)``, or
    ``sampler = None`` / ``if distributed: sampler = DistributedSampler(ds)``)."""
    return any(m.call_is(v, DISTRIBUTED_SAMPLER) for v in sampler_values(m, expr))


def is_false(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def loaders(m: SemanticModel) -> List[Loader]:
    got = m.cache.get("loaders")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Loader] = []
    classes = _iterable_classes(m)
    for call in m.calls(DATALOADER):
        target = assign_target(m, call)
        func = m.enclosing_function(call)
        label = loader_label(target, func, m)
        positional = list(call.args)
        problem = None
        star = any(isinstance(a, ast.Starred) for a in positional) or any(
            k.arg is None and kwargs_keys(m, k.value) is None for k in call.keywords
        )
        extra = set()
        for k in call.keywords:
            if k.arg is None:
                extra |= kwargs_keys(m, k.value) or set()
        dataset = argument(call, DATALOADER_PARAMS, "dataset")
        batch = argument(call, DATALOADER_PARAMS, "batch_size")
        shuffle = kwarg(call, "shuffle")
        sampler = kwarg(call, "sampler")
        batch_sampler = kwarg(call, "batch_sampler")
        sampler_value = follow(m, sampler.value) if sampler is not None else None
        name = label or "DataLoader"
        iterable = _is_iterable(m, dataset, classes)
        if star:
            problem = f"{name} is built from *args/**kwargs: add a DistributedSampler by hand"
        elif len(positional) > 2:
            problem = f"{name} has positional shuffle/sampler arguments: add a DistributedSampler by hand"
        elif extra & {"sampler", "batch_sampler", "dataset"}:
            problem = f"{name} takes its sampler from a **kwargs dict: shard it per rank by hand (every rank now sees all data)"
        elif batch_sampler is not None:
            problem = f"{name} uses a batch_sampler: shard it per rank by hand (every rank now sees all data)"
        elif iterable:
            problem = f"{name} reads an IterableDataset: no sampler can be added (shard_loader splits its batches at run time)"
        elif dataset is None:
            problem = f"{name} has no dataset argument dp2ddp can read"
        elif sampler is not None and not (
            isinstance(sampler.value, ast.Constant) and sampler.value.value is None
        ) and not (m.call_is(sampler_value, RANDOM_SAMPLER) and sampler_value.args):  # type: ignore[union-attr]
            if distributed_sampler(m, sampler_value):
                problem = None
            elif m.call_is(sampler_value, SEQUENTIAL_SAMPLER) and not (shuffle is not None and not is_false(shuffle.value)):
                problem = None  # in order, whole: an evaluation loader
            else:
                problem = (
                    f"{name} uses a custom sampler: shard it per rank by hand "
                    "(e.g. DistributedSampler or a per-rank subset); every rank now sees all data"
                )
        keyed = _keyed(m, call)
        comp, keys, holder = keyed if keyed is not None else (None, (), None)
        if keyed is not None and comp is None:
            # {"train": DataLoader(...), "val": DataLoader(...)}: the key names it
            label = f"{m.source(holder)}[{keys[0]!r}]" if holder is not None else str(keys[0])
        training = is_training(m, call, label, shuffle, sampler_value)
        if not training and "shuffle" in extra and shuffle is None and sampler is None:
            lowered = label.lower()
            training = not (any(w in lowered for w in EVAL_WORDS) and "train" not in lowered)
        star_dict = next((k.value for k in call.keywords if k.arg is None), None)
        held = _held(m, call)
        out.append(Loader(call, dataset, batch, shuffle, sampler, sampler_value, batch_sampler, kwarg(call, "num_workers"),
                          target, func, label, problem, training and not held, iterable, star_dict, frozenset(extra), held,
                          comp, keys, keys if training and comp is None else (), holder))
    m.cache["loaders"] = out
    for ld in out:
        if ld.comp is not None:
            # one loader per key: a key trains where a training loop feeds on its item, or
            # where the key names training (``"train"`` with a shuffle), as a name would
            ld.train_keys = tuple(k for k in ld.keys if feeds_training(m, ld.comp, (k,)) or
                                  is_training(m, ld.call, str(k), ld.shuffle, ld.sampler_value))
            ld.training = bool(ld.train_keys) and not ld.held
            continue
        if not ld.training and not ld.held and feeds_training(m, ld.call):
            ld.training = True  # whatever its name says, a training loop iterates it
            ld.train_keys = ld.keys
        elif ld.training and not ld.held and _evaluated_where_made(m, ld):
            ld.training, ld.train_keys = False, ()  # a shuffling loader a function that never trains makes and reads
    from dp2ddp.model.inference import inference_only

    if out and inference_only(m):
        for ld in out:  # nothing trains here: a shuffled loader is one evaluated in a random order
            ld.training, ld.train_keys = False, ()
    return out


def _evaluated_where_made(m: SemanticModel, ld: Loader) -> bool:
    """The loader is made into a local name of a function that never trains (no backward pass
    it reaches, here or in the project), and the function only iterates it (``for``,
    ``iter()``, ``enumerate()``, ``len()``, its ``.dataset``): crnn's ``val()`` builds a
    shuffling ``data_loader`` each time it evaluates. Handed to anything else (a Trainer, a
    library's ``fit``) it may train there: not this."""
    from dp2ddp.model.flow import WRAPPERS
    from dp2ddp.model.training import trains

    func = ld.function
    if func is None or not isinstance(ld.target, ast.Name) or trains(m, func) or feeds_training(m, ld.call):
        return False
    lowered = getattr(func, "name", "").lower()
    if not any(w in lowered for w in EVAL_WORDS) or "train" in lowered:
        return False  # ``main()`` whose loop steps through ``model.optimize_parameters()``: not shown to train, may
    name = ld.target.id
    for n in ast.walk(func):
        if isinstance(n, (ast.Global, ast.Nonlocal)) and name in n.names:
            return False
        if not (isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)):
            continue
        parent = m.parent(n)
        if isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is n:
            continue
        if isinstance(parent, ast.Attribute) and parent.attr in ("dataset", "batch_size", "sampler"):
            continue
        if (isinstance(parent, ast.Call) and parent.args and parent.args[0] is n and isinstance(parent.func, ast.Name)
                and (parent.func.id in WRAPPERS or parent.func.id == "len")):
            continue
        return False
    return True


def evaluated_apart(m: SemanticModel, call: ast.Call) -> Optional[ast.AST]:
    """A loop that never trains and iterates what the DataLoader construction ``call`` makes,
    under another name than any training loop iterates: the construction makes evaluation
    loaders too (Informer's ``_get_data(flag)`` builds the train, validation and test
    loaders at one call). Sharding it would shard the evaluation as well: per-rank metrics,
    and an early stop that one rank takes and the other does not. The loop, or ``None``."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.syntax import terminal
    from dp2ddp.model.training import training_loops, under_no_grad
    from dp2ddp.model.training_feeds import NOT_DATA, fed_values, iterated

    factory = m.enclosing_function(call)
    fed = [(v, loop) for v, loop in fed_values(m)  # the loops that take the training batches (not epochs)
           if not (isinstance(v, ast.Call) and terminal(v.func) in NOT_DATA)]
    batch_loops = [loop for _, loop in fed]
    if factory is None or not batch_loops or any(m.contains(factory, loop) for loop in training_loops(m)):
        return None  # made where it trains, or at the top level: a loader of its own
    trained = {id(loop) for loop in batch_loops}
    reached = {id(f) for loop in batch_loops for f in m.reach(loop)}  # the training step's helpers
    trained_names = {m.source(v) for v, _ in fed}
    for loop in m.nodes(ast.For):
        func = m.enclosing_function(loop)
        if id(loop) in trained or any(id(a) in trained for a in m.ancestors(loop)) or id(func) in reached:
            continue
        evaluates = under_no_grad(m, loop) or (func is not None and any(
            isinstance(c.func, ast.Attribute) and c.func.attr == "eval" and not c.args and c.lineno <= loop.lineno
            for c in m.calls_in(func)))
        if not evaluates:
            continue  # not an evaluation: gradients on, and no model put in eval mode before it
        for v in iterated(loop.iter):
            if m.source(v) in trained_names or not isinstance(v, ast.Name):
                continue  # the training loader itself, evaluated (train accuracy)
            if any(node is call for node, _ in origins(m, v)):
                return loop
    return None


def grouped_batches(m: SemanticModel) -> List[Tuple[Loader, ast.AST, ast.AST]]:
    """Loaders whose every item is a group of batches (FastSpeech2's ``collate_fn`` sorts a
    loader batch of ``batch_size * group_size`` samples by length and cuts it into batches of
    the dataset's own ``batch_size``): a loop over the loader whose body runs a training loop
    over the item (``for batchs in loader: for batch in batchs: ...backward()``), the loader
    given a ``collate_fn``. ``(loader, outer loop, inner loop)``."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.training import training_loops
    from dp2ddp.model.training_feeds import iterated

    got = m.cache.get("loaders:grouped")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[Loader, ast.AST, ast.AST]] = []
    by_call = {id(ld.call): ld for ld in loaders(m) if kwarg(ld.call, "collate_fn") is not None}
    inner_loops = {id(lp): lp for lp in training_loops(m) if isinstance(lp, ast.For)}
    for outer in m.nodes(ast.For):
        if not isinstance(outer.target, ast.Name) or not by_call:
            continue
        made = [node for e in iterated(outer.iter) for node, path in origins(m, e) if not path]
        found = next((by_call[id(n)] for n in made if id(n) in by_call), None)
        if found is None:
            continue
        for inner in (n for n in ast.walk(outer) if id(n) in inner_loops and n is not outer):
            if any(isinstance(v, ast.Name) and v.id == outer.target.id for v in iterated(inner.iter)):
                out.append((found, outer, inner))
                break
    m.cache["loaders:grouped"] = out
    return out


def feeds_training(m: SemanticModel, node: ast.AST, path: tuple = ()) -> bool:
    """What ``node`` makes (item ``path`` of it) is iterated by a training loop
    (:func:`dp2ddp.model.training_feeds.trained_origins`)."""
    from dp2ddp.model.training_feeds import trained_origins

    return (id(node), path) in trained_origins(m)


def is_training(m: SemanticModel, call: ast.Call, label: str, shuffle: Optional[ast.keyword], sampler_value) -> bool:
    """A loader trains when it shuffles (``shuffle=<not False>``, a RandomSampler, a
    shuffling DistributedSampler) or when its name says ``train`` and nothing says
    evaluation."""
    lowered = label.lower()
    if any(w in lowered for w in EVAL_WORDS) and "train" not in lowered:
        return False  # an evaluation loader, even a shuffling one
    values = sampler_values(m, sampler_value)
    if len(values) > 1 or (values and values[0] is not sampler_value):
        if any(is_training(m, call, label, shuffle, v) for v in values if not (isinstance(v, ast.Constant) and v.value is None)):
            return True
        if all(isinstance(v, ast.Constant) and v.value is None for v in values):
            sampler_value = None
        else:
            return False
    if sampler_value is not None and m.call_is(sampler_value, RANDOM_SAMPLER | DISTRIBUTED_SAMPLER):
        sh = kwarg(sampler_value, "shuffle")
        return sh is None or not is_false(sh.value)
    if sampler_value is not None and m.call_is(sampler_value, SEQUENTIAL_SAMPLER):
        return False
    if shuffle is not None and not is_false(shuffle.value) and not (isinstance(shuffle.value, ast.Constant) and shuffle.value.value is None):
        return True
    lowered = label.lower()
    return "train" in lowered and not any(w in lowered for w in EVAL_WORDS)


def _held(m: SemanticModel, call: ast.Call) -> bool:
    """``call`` is the DataLoader a class of this module holds and iterates
    (:func:`dp2ddp.model.held_loaders.class_holds`): whether it trains is a question for
    each object of the class."""
    func = m.enclosing_function(call)
    cls = m.parent(func) if func is not None else None
    if not isinstance(cls, ast.ClassDef):
        return False
    got = class_holds(m, cls)
    return got is not None and got[1] is call
