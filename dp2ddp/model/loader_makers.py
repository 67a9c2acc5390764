"""DataLoaders made by the project's own code rather than by a ``DataLoader(...)`` call.

* :func:`subclass_calls`: ``MyLoader(...)`` where ``MyLoader`` derives from DataLoader (a
  class of this module or of a project module), with its label and whether it trains.
* :func:`returned_loaders`: calls of a project function that returns DataLoaders
  (``train_loader, test_loader = data.get(args)``), with the names here that hold its
  training loaders; :func:`loaders_returned_by`: which loaders such a function returns, by position or key.

The ``DataLoader(...)`` calls themselves are :func:`dp2ddp.model.loaders.loaders`; an object
that holds one and iterates it is :mod:`dp2ddp.model.held_loaders`.
"""

from __future__ import annotations

import ast
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from dp2ddp.model.call_args import DATALOADER_PARAMS, argument
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.loaders import (
    EVAL_WORDS,
    Loader,
    assign_target,
    feeds_training,
    is_false,
    loader_label,
    loaders,
)
from dp2ddp.model.names import DATALOADER
from dp2ddp.model.syntax import kwarg, terminal


def _loader_classes(m: SemanticModel) -> Set[str]:
    """Names of this module's classes that derive from DataLoader (directly or through
    another such class of the module)."""
    got = m.cache.get("loader_classes")
    if got is not None:
        return got  # type: ignore[return-value]
    out: Set[str] = set()
    changed = True
    while changed:
        changed = False
        for cls in m.nodes(ast.ClassDef):
            if cls.name not in out and any(m.is_name(b, DATALOADER) or (isinstance(b, ast.Name) and b.id in out) for b in cls.bases):
                out.add(cls.name)
                changed = True
    m.cache["loader_classes"] = out
    return out


def _training_label(label: str) -> bool:
    lowered = label.lower()
    return "train" in lowered and not any(w in lowered for w in EVAL_WORDS)


def _evaluation_label(label: str) -> bool:
    lowered = label.lower()
    return "train" not in lowered and any(w in lowered for w in EVAL_WORDS)


def subclass_calls(m: SemanticModel) -> List[Tuple[ast.Call, str, bool]]:
    """``MyLoader(...)`` where ``MyLoader`` derives from DataLoader (a class of this module or
    of a project module): ``(call, label, training)``; training when it shuffles or its name
    says ``train``."""
    from dp2ddp.model.project_defs import project_def

    got = m.cache.get("subclass_calls")
    if got is not None:
        return got  # type: ignore[return-value]
    local = _loader_classes(m)
    out: List[Tuple[ast.Call, str, bool]] = []
    for call in m.nodes(ast.Call):
        f = call.func
        is_sub = False
        if isinstance(f, ast.Name) and f.id in local:
            _, bindings = m.lookup(f.id, m.scope_of(f))
            is_sub = bool(bindings) and all(b.kind == "class" for b in bindings)
        elif not m.call_is(call, DATALOADER):
            found = project_def(m, f) if isinstance(f, (ast.Name, ast.Attribute)) else None
            if found is not None and isinstance(found[1], ast.ClassDef):
                pm, cls, _ = found
                is_sub = cls.name in _loader_classes(pm)
        if not is_sub:
            continue
        target = assign_target(m, call)
        label = loader_label(target, m.enclosing_function(call), m) or terminal(f) or "loader"
        shuffle = kwarg(call, "shuffle")
        training = (shuffle is not None and not is_false(shuffle.value)) or _training_label(label)
        training = training or feeds_training(m, call)
        out.append((call, label, training))
    m.cache["subclass_calls"] = out
    return out


def loaders_returned_by(pm: SemanticModel, func: ast.AST) -> Optional[Dict[object, Loader]]:
    """The loaders ``func`` (a function of ``pm``) returns: index in the returned tuple (or
    ``None`` for the value itself, or a dict key) -> the loader; ``None`` when it returns
    none."""
    made = list(loaders(pm)) + [_Subclassed(call, training) for call, _label, training in subclass_calls(pm)]
    by_call = {id(ld.call): ld for ld in made}
    by_name: Dict[str, Loader] = {}
    for ld in made:
        target = assign_target(pm, ld.call)
        if pm.enclosing_function(ld.call) is func and isinstance(target, ast.Name):
            by_name[target.id] = ld  # type: ignore[assignment]

    def loader_of(v: ast.AST) -> Optional[Loader]:
        if isinstance(v, ast.Call):
            return by_call.get(id(v))
        if isinstance(v, ast.Name):
            return by_name.get(v.id)
        return None

    out: Dict[object, Loader] = {}
    for ret in ast.walk(func):
        if not isinstance(ret, ast.Return) or ret.value is None or pm.enclosing_function(ret) is not func:
            continue
        v = ret.value
        if isinstance(v, (ast.Tuple, ast.List)):
            for i, e in enumerate(v.elts):
                ld = loader_of(e)
                if ld is not None:
                    out[i] = ld
        elif isinstance(v, ast.Dict):
            for k, e in zip(v.keys, v.values):
                ld = loader_of(e)
                if ld is not None and isinstance(k, ast.Constant) and isinstance(k.value, str):
                    out[k.value] = ld
        else:
            ld = loader_of(v)
            if ld is not None:
                out[None] = ld
    return out or None


class _Subclassed:
    """A loader a DataLoader subclass makes (``InfiniteDataLoader(dataset, sampler=...)``), as
    :func:`loaders_returned_by` reports it: its call, whether it trains, its batch size and
    sampler (read by DataLoader's signature, as :func:`dp2ddp.model.loaders.loaders` reads them)."""

    def __init__(self, call: ast.Call, training: bool) -> None:
        self.call = call
        self.training = training
        self.batch_size = argument(call, DATALOADER_PARAMS, "batch_size")
        self.sampler_value = argument(call, DATALOADER_PARAMS, "sampler")


def own_sampler(pm: SemanticModel, ld) -> bool:
    """The returned loader ``ld`` (of module ``pm``) is given a ``DistributedSampler`` on some
    path (``sampler = DistributedSampler(dataset) if rank != -1 else None``): the sampler of a
    mixed script's own distributed path, which shards it there."""
    from dp2ddp.model.loaders import distributed_sampler

    return ld.sampler_value is not None and distributed_sampler(pm, ld.sampler_value)


def _returned_name(m: SemanticModel, target: Optional[ast.AST], key: object) -> Optional[str]:
    """The expression that holds the returned loader ``key`` after ``target = call``."""
    if target is None:
        return None
    if isinstance(key, int):
        if not isinstance(target, (ast.Tuple, ast.List)) or key >= len(target.elts) or any(isinstance(e, ast.Starred) for e in target.elts):
            return None
        target = target.elts[key]
    elif isinstance(key, str):
        return f"{m.source(target)}[{key!r}]" if isinstance(target, (ast.Name, ast.Attribute)) else None
    return m.source(target) if isinstance(target, (ast.Name, ast.Attribute, ast.Subscript)) else None


class Returned(NamedTuple):
    """A call of a project function (or of a project object's method) that returns DataLoaders."""

    call: ast.Call
    names: List[str]  # the names here that hold its training loaders (``train_loader``, ``loaders['train']``)
    lost: Optional[str]  # why a training loader it returns cannot be named here
    inline: bool  # the call's value is itself the training loader, used in place (``Trainer(data.loader(), cfg)``)
    own: bool = False  # every training loader it returns has a DistributedSampler on some path (:func:`own_sampler`)
    batch: Optional[ast.AST] = None  # what this script passes as their batch size (:func:`_bound_batch`)


def returned_loaders(m: SemanticModel) -> List[Returned]:
    """Calls of a function of the project's own modules that returns DataLoaders
    (``train_loader, test_loader = data.get(args)``, ``Trainer(data.loader(), config)``). A
    returned loader is training when it is in its module or when the name it is given here
    (or what the value feeds) says so."""
    from dp2ddp.model.project_defs import project_calls

    got = m.cache.get("returned_loaders")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Returned] = []
    for call, (pm, func, rel) in project_calls(m):
        if isinstance(func, ast.ClassDef):
            continue
        returned = loaders_returned_by(pm, func)
        if not returned:
            continue
        where = f"{rel}:{func.lineno}"
        parent = m.parent(call)
        target = parent.targets[0] if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and parent.value is call else None
        names: List[str] = []
        lost = None
        inline = False
        trained = []
        for key, ld in returned.items():
            text = _returned_name(m, target, key)
            label = text if text is not None else (m.source(target) if target is not None else "")
            fed = feeds_training(m, call, () if key is None else (key,))
            if not (ld.training or _training_label(label.rsplit(".", 1)[-1]) or fed):
                continue
            if not fed and _evaluation_label(label.rsplit(".", 1)[-1]):
                continue  # ``val_loader = create_dataloader(val_set, opt)``: the maker shuffles for its training phase only
            trained.append(ld)
            if text is None and key is None and target is None and not isinstance(parent, ast.Expr):
                inline = True  # the value itself, where it is used: shard it there
            elif text is None:
                lost = lost or (f"the training loader {func.name}() returns ({where}) is not bound to a name at this call: "
                                "dp2ddp cannot shard it; unpack it into names first")
            else:
                names.append(text)
        own = bool(trained) and all(own_sampler(pm, ld) for ld in trained)
        out.append(Returned(call, names, lost, inline, own, _bound_batch(call, pm, func, trained)))
    m.cache["returned_loaders"] = out
    return out


def _bound_batch(call: ast.Call, pm: SemanticModel, func: ast.AST, trained: list) -> Optional[ast.AST]:
    """The expression of this script that is the batch size of the training loaders ``trained``
    that ``func`` (called by ``call``) returns: the argument bound to the function's parameter
    the loaders read as ``batch_size`` (``getData(train_bs=args.batch_size)`` whose loader is
    ``DataLoader(trainset, batch_size=train_bs)``: ``args.batch_size``). ``None`` where they
    read anything else (a constant, a value the function computes or sets again)."""
    if not trained or isinstance(pm.parent(func), ast.ClassDef):
        return None  # a method: its first parameter is the object, not an argument
    params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]  # type: ignore[attr-defined]
    values = set()
    for ld in trained:
        batch = ld.batch_size
        if not isinstance(batch, ast.Name) or batch.id not in params or pm.enclosing_function(ld.call) is not func:
            return None
        _, bindings = pm.lookup(batch.id, pm.scope_of(batch))
        if not bindings or any(b.kind != "param" for b in bindings):
            return None  # set again inside (``batch_size = min(batch_size, len(dataset))``)
        arg = argument(call, params, batch.id)
        if arg is None:
            return None
        values.add(arg)
    return values.pop() if len(values) == 1 else None


def training_sites(m: SemanticModel, r: Returned) -> Optional[List[Tuple[ast.stmt, List[str]]]]:
    """Where to shard the training loaders of ``r`` when its call also makes evaluation
    loaders (:func:`dp2ddp.model.loaders.evaluated_apart`): the call sits in a function of
    this module (Autoformer's ``_get_data(flag)`` around ``data_provider(self.args, flag)``),
    and each training loop's loader is bound by a call of that function of its own
    (``train_data, train_loader = self._get_data(flag='train')``), apart from the calls that
    bind the evaluation loaders (``flag='val'``, ``flag='test'``). Sharded after those
    statements, the training loaders are sharded and the others stay whole. ``[(statement,
    [name])]``, or ``None`` where a training loop's loader is not bound so, or where every
    call of the function binds a training loader (nothing is evaluation apart)."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.training_feeds import NOT_DATA, fed_values

    func = m.enclosing_function(r.call)
    if func is None:
        return None
    sites: Dict[int, Tuple[ast.stmt, List[str]]] = {}
    for value, _loop in fed_values(m):
        if isinstance(value, ast.Call) and terminal(value.func) in NOT_DATA:
            continue
        if not any(node is r.call for node, _ in origins(m, value)):
            continue  # another loader: not this call's
        if not isinstance(value, ast.Name):
            return None
        _, bindings = m.lookup(value.id, m.scope_of(value))
        stmts = [b.node if isinstance(b.node, ast.stmt) else m.statement_of(b.node) for b in bindings]
        if len(stmts) != 1 or not isinstance(stmts[0], ast.Assign) or len(stmts[0].targets) != 1:
            return None
        stmt = stmts[0]
        call = stmt.value
        if not (isinstance(call, ast.Call) and m.resolve_call(call) is func):
            return None  # bound some other way: the loader is not this call's alone
        target = stmt.targets[0]
        names = [target] if isinstance(target, ast.Name) else list(getattr(target, "elts", []))
        if not any(isinstance(n, ast.Name) and n.id == value.id for n in names):
            return None
        sites.setdefault(id(stmt), (stmt, []))
        if value.id not in sites[id(stmt)][1]:
            sites[id(stmt)][1].append(value.id)
    if not sites:
        return None
    site_calls = {id(s.value) for s, _ in sites.values()}
    others = [c for c in m.nodes(ast.Call) if m.resolve_call(c) is func and id(c) not in site_calls]
    return list(sites.values()) if others else None
