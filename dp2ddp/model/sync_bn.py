"""DataParallel with replication callbacks: Synchronized-BatchNorm-PyTorch's
``DataParallelWithCallback``, vendored into many segmentation projects as
``sync_batchnorm/replicate.py``.

Such a class derives from DataParallel and overrides only ``replicate``: it calls
DataParallel's own and then lets every module of the copies run a callback
(``__data_parallel_replicate__``), through which the ``SynchronizedBatchNorm`` layers of the
copies share their statistics: BatchNorm over the whole batch across the GPUs, where plain
DataParallel normalises each GPU's chunk apart. DDP never replicates, so the callbacks never
run; what they achieved is ``torch.nn.SyncBatchNorm`` across the ranks, which converts any
BatchNorm (``SynchronizedBatchNorm*d`` derive from torch's ``_BatchNorm``). A call of such a
class is a DataParallel wrap whose migration also converts the model's BatchNorm layers
(with CUDA: torch's SyncBatchNorm runs on GPUs only; on CPU, like the original run there,
each process normalises its own batch).

The same package's ``patch_replication_callback(dp)`` gives an existing DataParallel the
callbacks (it asserts its argument is a DataParallel and replaces its ``replicate``): a
*replication patcher*. A module whose DataParallel references all lie in such classes and
patchers is the package itself (:func:`dp_library`): nothing in it is migrated.
"""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DP


def _super_replicate(node: ast.AST) -> bool:
    """``super().replicate(...)`` / ``super(Cls, self).replicate(...)``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replicate"
            and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super")


def _copies_then_callbacks(fn: ast.FunctionDef, makes_copies) -> bool:
    """``fn``'s body is ``copies = <DataParallel's replicate>(...)``, one or more calls that
    take the copies (the callbacks), ``return copies`` (a docstring allowed)."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) < 3 or not all(isinstance(d, ast.Call) for d in fn.decorator_list):  # ``@functools.wraps(old)``
        return False
    first, middle, last = body[0], body[1:-1], body[-1]
    if not (isinstance(first, ast.Assign) and len(first.targets) == 1 and isinstance(first.targets[0], ast.Name)
            and makes_copies(first.value)):
        return False
    name = first.targets[0].id
    if not (isinstance(last, ast.Return) and isinstance(last.value, ast.Name) and last.value.id == name):
        return False
    return all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
               and any(isinstance(a, ast.Name) and a.id == name for a in s.value.args) for s in middle)


def replicates_with_callbacks(m: SemanticModel, cls: ast.ClassDef) -> bool:
    """``cls`` (a class of ``m``) derives from DataParallel alone and overrides only
    ``replicate``, which returns what DataParallel's own returns after calling something on
    it (the replication callbacks)."""
    if len(cls.bases) != 1 or not m.is_name(cls.bases[0], DP) or cls.keywords or cls.decorator_list:
        return False
    body = [s for s in cls.body if not (isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)))]
    if len(body) != 1 or not isinstance(body[0], ast.FunctionDef) or body[0].name != "replicate" or body[0].decorator_list:
        return False
    return _copies_then_callbacks(body[0], _super_replicate)


def callback_class(m: SemanticModel, call: ast.AST) -> Optional[ast.ClassDef]:
    """The DataParallel-with-callbacks class of a project module that ``call`` makes (the
    vendored ``sync_batchnorm`` package), else ``None``. (One defined in the script itself
    stays a DataParallel subclass the rewrite cannot rebase.) Read from
    :func:`dp2ddp.model.project_defs.project_calls`, once per model."""
    got = m.cache.get("sync_bn:classes")
    if got is None:
        from dp2ddp.model.project_defs import project_calls

        got = m.cache["sync_bn:classes"] = {
            id(c): node for c, (pm, node, _rel) in project_calls(m) if isinstance(node, ast.ClassDef) and replicates_with_callbacks(pm, node)}
    return got.get(id(call))  # type: ignore[union-attr]


def replication_patcher(pm: SemanticModel, fn: ast.AST) -> bool:
    """``fn`` (a function of ``pm``) replaces the ``replicate`` of the DataParallel it takes
    as its first parameter by a function that runs callbacks on the copies the old one
    makes (``old = dp.replicate``; ``def new(...): copies = old(...); callbacks(copies);
    return copies``; ``dp.replicate = new``)."""
    if not isinstance(fn, ast.FunctionDef) or not fn.args.args:
        return False
    first = fn.args.args[0].arg

    def is_replicate(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "replicate" and isinstance(node.value, ast.Name) and node.value.id == first

    olds = {t.id for n in fn.body if isinstance(n, ast.Assign) and is_replicate(n.value) for t in n.targets if isinstance(t, ast.Name)}
    nested = {n.name: n for n in fn.body if isinstance(n, ast.FunctionDef)}
    for n in fn.body:
        if isinstance(n, ast.Assign) and any(is_replicate(t) for t in n.targets) and isinstance(n.value, ast.Name):
            new = nested.get(n.value.id)
            if new is not None and _copies_then_callbacks(
                    new, lambda v: isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id in olds):
                return True
    return False


def patcher_calls(m: SemanticModel) -> list:
    """The calls of this module to a project's replication patcher (``patch_replication_callback(model)``)."""
    from dp2ddp.model.project_defs import project_calls

    return [c for c, (pm, node, _rel) in project_calls(m) if replication_patcher(pm, node)]


def dp_library(pm: SemanticModel) -> bool:
    """Every DataParallel reference of ``pm`` is the base of a class that only adds
    replication callbacks, or lies in a replication patcher: the synchronized-BatchNorm
    package, not code that wraps a model."""
    refs = [n for n in pm.nodes(ast.Name, ast.Attribute) if isinstance(getattr(n, "ctx", None), ast.Load) and pm.qualified_names(n) & DP]
    if not refs:
        return False
    for ref in refs:
        cls = pm.enclosing_class(ref)
        fn = pm.enclosing_function(ref)
        if fn is None and isinstance(cls, ast.ClassDef) and ref in cls.bases and replicates_with_callbacks(pm, cls):
            continue
        if fn is not None and replication_patcher(pm, fn) and (cls is None or pm.enclosing_function(cls) is not None):
            continue
        return False
    return True
