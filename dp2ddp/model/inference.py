"""Inference-only scripts: a script that wraps a model in DataParallel and never trains.

:func:`inference_only` is true for a module that runs (:func:`has_entry_point`), wraps a
model in DataParallel, has no training step of its own or reached through the project's
code (:func:`dp2ddp.model.training.training_site`), and never hands the wrapper, after
the wrap, to code of another module that might train it (``trainer.fit(model)``). Code
that cannot: the project's own, where nothing it may run backs a loss and the modules it
runs import no library but those known to train nothing (a class: every method, and its
project bases'; a deep copy followed where it goes: GAN_stability's ``Evaluator``); and
any code at all where nothing the script reaches trains (:func:`dp2ddp.project.trains_nowhere`:
pytorch-3dunet's ``predict.py`` hands its model to a predictor class picked by name).

In such a script nothing trains, so no loader is a training loader
(:mod:`dp2ddp.model.loaders` asks), and the migration is worth making only where every
evaluation loop can be shared out between the ranks (:mod:`dp2ddp.codemods.shard_eval`):
otherwise every rank would repeat the whole inference (DDP115).
"""

from __future__ import annotations

import ast
import os

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DDP, DP, DP_FUNCTIONAL


def inference_only(m: SemanticModel) -> bool:
    got = m.cache.get("inference:only")
    if got is None:
        got = m.cache["inference:only"] = _inference_only(m)
    return bool(got)


def _inference_only(m: SemanticModel) -> bool:
    from dp2ddp.model.entry_points import has_entry_point
    from dp2ddp.model.training import training_site
    from dp2ddp.model.uses import dp_wrapper_uses
    from dp2ddp.model.wraps import dp_wraps

    wraps = dp_wraps(m)
    if not wraps or not has_entry_point(m) or training_site(m) is not None:
        return False
    # handed to other code (``trainer.fit(model)``), it trains only where that code can:
    # not where nothing the script reaches trains (project.trains_nowhere)
    return not any(trains_elsewhere(m, u, wraps) for u in dp_wrapper_uses(m, functional=True)) or _trains_nowhere(m)


def unseen_training(m: SemanticModel):
    """``(call, what)`` for a script that wraps a model in DataParallel where nothing visible
    trains (:func:`trains_nothing_visible`), yet is not :func:`inference_only` either: the
    wrapper goes to code dp2ddp cannot read (``AutoAttack(model)``, robustbench's
    ``benchmark(model)``). That code may only evaluate (then every rank would repeat the whole
    of it) or may train on data dp2ddp cannot find (then no loader could be shown to be the
    one to shard): a loader named for training is no evidence either way. ``call``: where
    the wrapper is handed on; ``None`` where the script trains visibly or is inference-only.
    (A wrap in a project helper: :func:`dp2ddp.migrate._helper_inference`.)"""
    from dp2ddp.model.entry_points import has_entry_point
    from dp2ddp.model.uses import dp_wrapper_uses
    from dp2ddp.model.wraps import dp_wraps

    wraps = dp_wraps(m)
    if not wraps or not has_entry_point(m) or not trains_nothing_visible(m) or inference_only(m):
        return None
    handed = []
    for u in dp_wrapper_uses(m, functional=True):
        if trains_elsewhere(m, u, wraps):
            call = m.parent(u.node)
            handed.append((u.node, m.parent(call) if isinstance(call, ast.keyword) else call))
    if not handed or any(isinstance(c, ast.Call) and _project_code_verdict(m, c) == "trains" for _, c in handed):
        return None  # handed to nothing, or to project code that reaches a backward pass: it trains there
    handed_node, call = handed[0]
    return call, f"`{m.source(handed_node)}` is handed to `{m.source(call.func)}(...)` (line {call.lineno}), which may run code dp2ddp cannot read"


def trains_nothing_visible(m: SemanticModel) -> bool:
    """No training step in the module or in the project code it runs
    (:func:`dp2ddp.model.training.training_site`), and no optimizer made in it
    (:func:`makes_optimizer`): if anything trains, it is code dp2ddp cannot read."""
    from dp2ddp.model.training import training_site

    return training_site(m) is None and not makes_optimizer(m)


def makes_optimizer(m: SemanticModel) -> bool:
    """The module makes an optimizer: a constructor known to be one (``torch.optim.SGD``), a
    call whose name says so (``build_optimizer(cfg, model)``, ``torch_optimizer.RAdam``), or a
    call handed a model's ``.parameters()`` directly (``Lookahead(model.parameters())``)."""
    from dp2ddp.model.steps import kind_of_value

    for call in m.nodes(ast.Call):
        if kind_of_value(m, call) == "optimizer":
            return True
        names = m.qualified_names(call.func) or {m.source(call.func)}
        if any("optim" in q.lower() for q in names):
            return True
        if any(x.startswith("builtins.") for x in names):
            continue
        for a in list(call.args) + [k.value for k in call.keywords]:
            if (isinstance(a, ast.Call) and isinstance(a.func, ast.Attribute)
                    and a.func.attr in ("parameters", "named_parameters") and not a.args):
                return True
    return False


def _trains_nowhere(m: SemanticModel) -> bool:
    from dp2ddp.project import trains_nowhere

    return os.path.isfile(m.path) and trains_nowhere(m.path, m)


def trains_elsewhere(m: SemanticModel, use, wraps) -> bool:
    """The wrapped model is handed, after its wrap, to code of another module
    (``trainer.fit(model)``), which may train it. A use before every wrap of its function
    (``logger.info(model)`` ahead of ``model = DataParallel(model)``) sees the bare model."""
    if use.kind != "other":
        return False
    if before_every_wrap(m, use.node, wraps):
        return False
    parent = m.parent(use.node)
    call = m.parent(parent) if isinstance(parent, ast.keyword) else parent
    if not isinstance(call, ast.Call) or call.func is use.node:
        return False
    q = m.qualified_names(call.func)
    if q & (DP | DP_FUNCTIONAL | DDP):
        return False  # the wrap itself
    if any(x.startswith("builtins.") for x in q):
        return False
    if q & {"copy.deepcopy", "copy.copy"}:
        return _copy_handed_on(m, call)
    return not _project_code_that_never_trains(m, call)


def _copy_handed_on(m: SemanticModel, call: ast.Call) -> bool:
    """``generator_test = copy.deepcopy(generator)``: the copy may train where it is handed
    to code that may (the same test as for the wrapper itself); kept in no name, it may."""
    stmt = m.parent(call)
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return True
    name = stmt.targets[0].id
    for other in m.nodes(ast.Call):
        args = list(other.args) + [k.value for k in other.keywords]
        if not any(isinstance(a, ast.Name) and a.id == name for a in args):
            continue
        q = m.qualified_names(other.func)
        if q & (DP | DP_FUNCTIONAL | DDP) or any(x.startswith("builtins.") for x in q):
            continue
        if not _project_code_that_never_trains(m, other):
            return True
    return False


# bases whose methods train nothing
_PLAIN_BASES = frozenset({"builtins.object", "torch.nn.Module", "torch.nn.modules.module.Module"})


def _project_code_that_never_trains(m: SemanticModel, call: ast.Call) -> bool:
    """``call`` runs the project's own code, and nothing that code may run reaches a backward
    pass: a function with what it calls (three project modules deep), or a class with every
    method of it and of its project bases (called later on the object: GAN_stability's
    ``Evaluator(generator)``, ``checkpoint_io.register_modules(generator=...)``). A call
    that also reaches code of another library, or that dp2ddp cannot follow, may train."""
    return _project_code_verdict(m, call) == "never"


def _project_code_verdict(m: SemanticModel, call: ast.Call) -> str:
    """What the code ``call`` runs does with what it is handed: ``"never"`` trains
    (:func:`_project_code_that_never_trains`), ``"trains"`` (project code it may run reaches a
    backward pass), or ``"unknown"`` (not the project's code, or code that imports a library
    dp2ddp cannot read, or a base class it cannot follow). Once per call (``trains_elsewhere``
    and :func:`unseen_training` both ask)."""
    memo = m.cache.setdefault("inference:verdicts", {})
    if id(call) not in memo:
        memo[id(call)] = _verdict(m, call)
    return memo[id(call)]  # type: ignore[no-any-return]


def _verdict(m: SemanticModel, call: ast.Call) -> str:
    from dp2ddp.model.project_defs import project_def, reach_across
    from dp2ddp.model.steps import is_backward
    from dp2ddp.model.syntax import FUNCTIONS

    found = project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
    if found is None:
        return "unknown"
    pm, node, rel = found
    starts = [node]
    if isinstance(node, ast.ClassDef):
        starts = [f for f in node.body if isinstance(f, FUNCTIONS)]
        for base in node.bases:  # a project base class's methods run too
            if not isinstance(base, (ast.Name, ast.Attribute)):
                return "unknown"
            if pm.qualified_names(base) & _PLAIN_BASES:
                continue
            hit = project_def(pm, base)
            if hit is None or not isinstance(hit[1], ast.ClassDef):
                return "unknown"  # a base dp2ddp cannot read: it may train
            starts += [f for f in hit[1].body if isinstance(f, FUNCTIONS)]
    from dp2ddp.project import imports_train_nothing

    base = os.path.dirname(os.path.abspath(m.path))
    modules = {}
    for start in starts:
        for mod, fn, _ in reach_across(pm, start, rel):
            if any(isinstance(c, ast.Call) and is_backward(mod, c) for c in ast.walk(fn)):
                return "trains"
            modules[id(mod)] = mod
    # what it reaches in other libraries is not followed: each module it runs code of may
    # import only project modules and libraries that train nothing they are given
    return "never" if all(imports_train_nothing(mod.path, mod.tree, base) for mod in modules.values()) else "unknown"


def before_every_wrap(m: SemanticModel, node: ast.AST, wraps) -> bool:
    """``node`` runs before every one of ``wraps``: all in its function, on earlier lines,
    and no loop holds both (a use there sees the bare model)."""
    func = m.enclosing_function(node)
    mine = [w for w in wraps if m.enclosing_function(w.call) is func]
    if not mine or len(mine) != len(wraps):
        return False
    line = getattr(node, "lineno", 0)
    if any(line >= w.call.lineno for w in mine):
        return False
    return not any(m.contains(loop, w.call) and m.contains(loop, node) for w in mine for loop in m.enclosing_loops(node))


def no_training_message(why: str = "", own_step: bool = True) -> str:
    """DDP115's line for an inference-only script that cannot be shared out: ``why`` says
    where (``own_step=False``: ``why`` says already that nothing trains, through the project)."""
    return (
        ("no training step in this file (no .backward(), no optimizer.step()), and " if own_step else "") + (why or
        "no loop over an evaluation DataLoader of the script to share out") + ": under DDP every rank would repeat "
        "the whole inference, which DataParallel split between the GPUs of one process; keep DataParallel here, "
        "or make the evaluation a loop whose results are sums or lists it appends to"
    )
