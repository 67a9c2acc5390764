"""The DataParallel wrapper a script hands to code of another project module, and what that
code does with the wrapper's ``state_dict`` keys.

``Trainer(model, optimizer, loader).train()`` of ``trainer.py`` keeps the wrapper as
``self.model`` (its ``__init__``, or a base class's through ``super().__init__(model, ...)``)
and saves ``self.model.state_dict()``, or resumes with ``self.model.load_state_dict(...)``;
a ``train(model, loader)`` function saves ``model.state_dict()``. Where the original's wrap
ran only with several GPUs, those keys were plain on one GPU and on the CPU, and the
migration's DDP wrapper, there on every run, would give them ``module.``.
:func:`handed_key_uses` finds those uses; the key policy of the wrap
(:func:`dp2ddp.model.checkpoint_keys.key_policy`, with :func:`dp2ddp.model.wrap_relations.key_flags`)
says which keys they keep (:func:`handed_key_policies`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.wraps import KEY_METHODS, Wrap

CLASS_NAME = "__name__"  # ``type(model).__name__``: saved beside the keys, it follows them


@dataclass(frozen=True)
class HandedKeyUse:
    """``<subject>.state_dict()`` or ``<subject>.load_state_dict(...)`` in a project module,
    where ``subject`` (``self.model``, or a function's parameter) holds the wrapper the
    script's ``call`` hands over."""

    call: ast.Call  # the script's call that hands the wrapper
    wrap: Wrap  # the wrap of the value handed
    module: str  # the project module's path
    rel: str  # that path relative to the script's folder
    subject: ast.AST  # ``self.model`` (of the project module's tree)
    method: str  # "state_dict" | "load_state_dict" | CLASS_NAME
    text: str  # the subject's source
    own: bool = False  # a class or function of the script itself (``module`` is the script)
    arg: Optional[ast.AST] = None  # the script's argument that hands the wrapper
    bare_elsewhere: bool = False  # the other branch of its ``if`` hands ``<arg>.module`` (bare_on_the_other_branch)

    @property
    def where(self) -> str:
        return f"{self.rel}:{self.subject.lineno}"


def handed_key_uses(m: SemanticModel) -> List[HandedKeyUse]:
    """The ``state_dict``/``load_state_dict`` calls that project modules make on a
    DataParallel wrapper this script hands them: kept by a project class it constructs
    (``self.<attr>`` bound once, in an ``__init__`` of the class's family, to the parameter
    the wrapper reaches) or used as a parameter of a project function it calls (never
    rebound there). Computed once per model."""
    got = m.cache.get("handed_wrappers:key_uses")
    if got is not None:
        return got  # type: ignore[return-value]
    from dp2ddp.model.uses import wrapper_keys
    from dp2ddp.model.wrap_relations import wrapped_keys
    from dp2ddp.model.wraps import dp_wraps

    out: List[HandedKeyUse] = []
    # the variables that hold each wrapper, followed through returns (SupContrast's ``model,
    # criterion = set_model(opt)``) and parameters, as wrap_ddp follows them
    wraps = [(w, wrapper_keys(m, wrapped_keys(m, w))) for w in dp_wraps(m) if not w.functional and w.target is not None]
    wraps = [(w, keys) for w, keys in wraps if keys]
    if wraps:
        for call in m.nodes(ast.Call):
            out.extend(_class_uses(m, call, wraps) or _function_uses(m, call, wraps))
    # a class name follows the keys saved beside it: alone, it is no checkpoint's business
    keyed = {(id(u.call), u.module) for u in out if u.method != CLASS_NAME}
    out = [u for u in out if u.method != CLASS_NAME or (id(u.call), u.module) in keyed]
    m.cache["handed_wrappers:key_uses"] = out
    return out


def _wrap_of(m: SemanticModel, arg: Optional[ast.AST], wraps) -> Optional[Wrap]:
    from dp2ddp.model.collectives import var_key

    if not isinstance(arg, (ast.Name, ast.Attribute)):
        return None
    key = var_key(m, arg)
    return next((w for w, keys in wraps if key in keys and not m.runs_before(arg, w.call)), None)


def key_calls(tree: ast.AST):
    """``(subject, method)`` of every ``subject.state_dict(...)``/``subject.load_state_dict(...)``
    call in ``tree``, and ``(subject, CLASS_NAME)`` of every ``type(subject).__name__`` and
    ``subject.__class__.__name__`` (pytorch-template saves ``arch = type(self.model).__name__``
    beside the keys: the model's class where one GPU ran bare, DistributedDataParallel through
    the wrapper)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in KEY_METHODS:
            yield node.func.value, node.func.attr
        elif isinstance(node, ast.Attribute) and node.attr == "__name__":
            inner = node.value
            if (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name) and inner.func.id == "type"
                    and len(inner.args) == 1 and not inner.keywords):
                yield inner.args[0], CLASS_NAME
            elif isinstance(inner, ast.Attribute) and inner.attr == "__class__":
                yield inner.value, CLASS_NAME


def _class_uses(m: SemanticModel, call: ast.Call, wraps) -> List[HandedKeyUse]:
    import os

    from dp2ddp.model.project_defs import class_of_call
    from dp2ddp.model.writing_classes import class_family

    found = class_of_call(m, call)
    if found is None:
        return []
    own = not found[2]  # a class of the script's own (its module is the script)
    family = class_family(m, *(found if not own else (m, found[1], os.path.basename(m.path))))
    out: List[HandedKeyUse] = []
    for cm, cls, rel in family:
        for subject, method in key_calls(cls):
            if not (isinstance(subject, ast.Attribute) and isinstance(subject.value, ast.Name) and subject.value.id == "self"):
                continue
            if unwraps_itself(cm, cm.enclosing_function(subject) or cls):
                continue
            arg = _self_attr_argument(family, call, subject.attr)
            w = _wrap_of(m, arg, wraps)
            if w is not None:
                out.append(HandedKeyUse(call, w, cm.path, rel, subject, method, cm.source(subject), own=cm is m, arg=arg,
                                        bare_elsewhere=bare_on_the_other_branch(m, call, arg)))
    return out


def _self_attr_argument(family, call: ast.Call, attr: str) -> Optional[ast.AST]:
    """The argument of ``call`` (a construction of the family's first class) that ``self.<attr>``
    keeps: the attribute is stored once in the whole family, ``self.<attr> = <param>`` in an
    ``__init__``, and that parameter is bound, through the ``super().__init__(...)`` calls
    between, to an argument of ``call``."""
    stores = [(cm, node) for cm, cls, _ in family for node in ast.walk(cls)
              if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
              and any(_is_self_attr(t, attr) for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    if len(stores) != 1 or not isinstance(stores[0][1], ast.Assign) or not isinstance(stores[0][1].value, ast.Name):
        return None
    cm, store = stores[0]
    inits: List[Tuple[SemanticModel, ast.AST]] = [(fm, fm.methods(fc)["__init__"]) for fm, fc, _ in family
                                                  if "__init__" in fm.methods(fc)]
    level = next((i for i, (fm, init) in enumerate(inits) if fm is cm and cm.contains(init, store)), None)
    if level is None:
        return None
    param = store.value.id  # type: ignore[union-attr]
    while True:
        fm, init = inits[level]
        if param not in fm.params(init):
            return None
        if level == 0:
            return fm.argument_for(init, call, param)
        pm, parent_init = inits[level - 1]
        sup = _super_init(parent_init)
        arg = fm.argument_for(init, sup, param) if sup is not None else None
        if not isinstance(arg, ast.Name):
            return None
        param, level = arg.id, level - 1


def _is_self_attr(t: ast.AST, attr: str) -> bool:
    return isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name) and t.value.id == "self"


def _super_init(init: ast.AST) -> Optional[ast.Call]:
    """The one ``super().__init__(...)`` call of an ``__init__`` (``None`` for none, or several)."""
    calls = [n for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "__init__" and isinstance(n.func.value, ast.Call)
             and isinstance(n.func.value.func, ast.Name) and n.func.value.func.id == "super"]
    return calls[0] if len(calls) == 1 else None


def _function_uses(m: SemanticModel, call: ast.Call, wraps) -> List[HandedKeyUse]:
    import os

    from dp2ddp.model.dp_idioms import handed
    from dp2ddp.model.project_defs import project_def
    from dp2ddp.model.syntax import FUNCTIONS

    own = m.resolve_call(call)
    found = (m, own, os.path.basename(m.path)) if own is not None else (
        project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None)
    if found is None or not isinstance(found[1], FUNCTIONS):
        return []
    pm, func, rel = found
    keys = set().union(*(k for _, k in wraps))
    arg, param = handed(m, pm, func, call, keys)
    w = _wrap_of(m, arg, wraps)
    if w is None or unwraps_itself(pm, func) or any(isinstance(n, ast.Name) and n.id == param and isinstance(n.ctx, ast.Store)
                                                   for n in ast.walk(func)):
        return []
    bare = bare_on_the_other_branch(m, call, arg)
    return [HandedKeyUse(call, w, pm.path, rel, subject, method, pm.source(subject), own=pm is m, arg=arg, bare_elsewhere=bare)
            for subject, method in key_calls(func) if isinstance(subject, ast.Name) and subject.id == param]


def bare_on_the_other_branch(m: SemanticModel, call: ast.Call, arg: Optional[ast.AST]) -> bool:
    """``if len(opt.gpu_ids) > 1: save_network(model.module, ...) else: save_network(model, ...)``
    (layumi/Person_reID_baseline_pytorch): ``call`` is a statement of one branch of an ``if``
    whose other branch makes the same call with ``<arg>.module`` in ``arg``'s place. The
    original handed the bare model on both paths; so does the migration, handed ``.module``."""
    stmt = m.parent(call)
    branch = m.parent(stmt) if isinstance(stmt, ast.Expr) and stmt.value is call else None
    if arg is None or not isinstance(branch, ast.If):
        return False
    others = branch.orelse if stmt in branch.body else branch.body if stmt in branch.orelse else []
    args = list(call.args) + [k.value for k in call.keywords]
    if not any(a is arg for a in args):
        return False
    where = next(i for i, a in enumerate(args) if a is arg)
    for other in others:
        o = other.value if isinstance(other, ast.Expr) else None
        if not (isinstance(o, ast.Call) and m.source(o.func) == m.source(call.func)):
            continue
        theirs = list(o.args) + [k.value for k in o.keywords]
        if (len(theirs) == len(args) and isinstance(theirs[where], ast.Attribute) and theirs[where].attr == "module"
                and m.source(theirs[where].value) == m.source(arg)):
            return True
    return False


def unwraps_itself(pm: SemanticModel, scope: ast.AST) -> bool:
    """The function (a method) deals with wrappers itself: it takes ``.module`` of something,
    names DataParallel (``isinstance(model, nn.DataParallel)``), or handles the ``module.``
    prefix (:func:`dp2ddp.model.checkpoint_keys.handles_prefix`): its keys are its own
    business (dp_idioms hands it ``model.module``, or refuses it)."""
    from dp2ddp.model.checkpoint_keys import handles_prefix
    from dp2ddp.model.names import DDP, DP

    for n in ast.walk(scope):
        if isinstance(n, ast.Attribute) and n.attr == "module":
            return True
        if isinstance(n, (ast.Name, ast.Attribute)) and pm.qualified_names(n) & (DP | DDP):
            return True
    return handles_prefix(scope)


def handed_key_policies(m: SemanticModel) -> List[Tuple[HandedKeyUse, object]]:
    """Each of :func:`handed_key_uses` with the key policy of its wrap
    (:class:`dp2ddp.model.checkpoint_keys.KeyPolicy`): which keys the migration keeps there."""
    from dp2ddp.model.checkpoint_keys import key_policy
    from dp2ddp.model.wrap_relations import key_flags

    policies: Dict[tuple, object] = {}
    out = []
    for use in handed_key_uses(m):
        flags = key_flags(m, use.wrap)
        policy = policies.get(flags) or policies.setdefault(flags, key_policy(m, *flags))
        out.append((use, policy))
    return out
