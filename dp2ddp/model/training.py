"""Where the script trains: which code reaches a backward pass and which runs without gradients.

A *training loop* is a loop whose body reaches a ``.backward()`` call — in the loop
itself, in a function of this module it calls (methods through ``self`` and their
overrides included), or in a function of a project module it calls
(:func:`training_loops`, :func:`trains`); one whose passes also change the parameters
(an optimizer step, a pass over ``parameters()``) :func:`updates` them. Code under
``torch.no_grad()`` or ``inference_mode()`` runs with gradients off
(:func:`under_no_grad`). :func:`training_site` says where a module trains at all, in its
own code or in the project code it calls.

What such a loop iterates is :mod:`dp2ddp.model.training_feeds`'s; the keys of a dict of
loaders it trains on, :mod:`dp2ddp.model.phase_keys`'s; its loops over settings,
:mod:`dp2ddp.model.settings_loops`'s.
"""

from __future__ import annotations

import ast
from typing import List, NamedTuple, Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.project_defs import project_def, project_defs
from dp2ddp.model.call_args import SET_GRAD_ENABLED_PARAMS, argument
from dp2ddp.model.syntax import is_const


NO_GRAD = frozenset({"torch.no_grad", "torch.inference_mode", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"})


def under_no_grad(m: SemanticModel, node: ast.AST) -> bool:
    """``node`` runs with gradients off: inside ``with torch.no_grad():`` (or
    ``inference_mode()``, ``set_grad_enabled(False)``), or in a function decorated
    ``@torch.no_grad()`` / ``@torch.inference_mode()``."""
    for a in m.ancestors(node):
        if isinstance(a, (ast.With, ast.AsyncWith)):
            for item in a.items:
                e = item.context_expr
                if isinstance(e, ast.Call) and m.is_name(e.func, NO_GRAD):
                    return True
                if isinstance(e, ast.Call) and m.is_name(e.func, {"torch.set_grad_enabled"}) and is_const(
                        argument(e, SET_GRAD_ENABLED_PARAMS, "mode"), False):
                    return True
        elif isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in a.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if m.is_name(target, NO_GRAD):
                    return True
    return False


def is_backward(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "backward"


def project_trains(m: SemanticModel, call: ast.Call, depth: int = 0) -> bool:
    """``call`` reaches a function of a project module that (itself, or through what it
    calls in its module) calls ``.backward()``."""
    return _project_reaches(m, call, "trains", is_backward, False, depth)


def trains(m: SemanticModel, node: ast.AST, depth: int = 0) -> bool:
    """Code at ``node`` (a loop, a function) reaches a ``.backward()``."""
    return _reaches(m, node, "trains", is_backward, False, depth)


def _reaches(m: SemanticModel, node: ast.AST, kind: str, pred, own: bool, depth: int) -> bool:
    """Code at ``node`` makes a call ``pred`` accepts: in the functions of this module it
    reaches (and, with ``own``, in ``node``'s own nodes: a statement), or, two modules deep,
    in a project module's function it calls. Memoised per model under ``kind``."""
    memo = m.cache.setdefault(f"training:{kind}", {})
    key = id(node)
    if key in memo:  # type: ignore[operator]
        return memo[key]  # type: ignore[index]
    memo[key] = False  # type: ignore[index]
    calls = ([n for n in ast.walk(node) if isinstance(n, ast.Call)] if own else []) + list(m.reached_calls(node))
    got = any(pred(c) for c in calls)
    if not got and depth < 2:
        got = any(_project_reaches(m, c, kind, pred, own, depth) for c in calls if m.resolve_call(c) is None)
    memo[key] = got  # type: ignore[index]
    return got


def _project_reaches(m: SemanticModel, call: ast.Call, kind: str, pred, own: bool, depth: int) -> bool:
    found = project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
    if found is None or isinstance(found[1], ast.ClassDef):
        return False
    return _reaches(found[0], found[1], kind, pred, own, depth + 1)


def training_loops(m: SemanticModel) -> List[ast.AST]:
    """Loops whose body reaches a ``.backward()``, innermost first where they nest."""
    got = m.cache.get("training:loops")
    if got is None:
        got = [lp for lp in m.nodes(ast.For, ast.AsyncFor, ast.While) if _body_trains(m, lp)]
        m.cache["training:loops"] = got
    return got  # type: ignore[return-value]


def _body_trains(m: SemanticModel, loop: ast.AST) -> bool:
    for stmt in loop.body:  # type: ignore[attr-defined]
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call):
                if is_backward(n):
                    return True
                t = m.resolve_call(n)
                if t is not None and trains(m, t):
                    return True
                if t is None and project_trains(m, n):
                    return True
    return False


def is_update(call: ast.Call) -> bool:
    """``optimizer.step()``, ``scaler.step(optimizer)``, ``optimizerD.step()``: a call of
    a ``step`` method, or a pass over the parameters (``for p in model.parameters():``, the
    hand-written SGD of the word language model)."""
    return isinstance(call.func, ast.Attribute) and call.func.attr in ("step", "parameters", "named_parameters")


def reaches_update(m: SemanticModel, node: ast.AST) -> bool:
    return _reaches(m, node, "updates", is_update, True, 0)


def updates(m: SemanticModel, loop: ast.AST) -> bool:
    """A training loop whose passes change the parameters: it reaches an update
    (:func:`is_update`), or one follows it in its function (``for x in loader:
    loss.backward()`` then ``optimizer.step()``: the whole pass accumulates). A loop that
    only reaches ``.backward()`` computes gradients for something else — an adversarial
    attack's input in an evaluation loop — and its data stays whole on every rank (every
    rank's gradients are then the same: correct, not sped up)."""
    if reaches_update(m, loop):
        return True
    node = loop
    for a in m.ancestors(loop):
        for field in ("body", "orelse", "finalbody", "handlers"):
            block = getattr(a, field, None)
            if isinstance(block, list) and any(s is node for s in block):
                after = block[[id(s) for s in block].index(id(node)) + 1:]
                if any(reaches_update(m, s) for s in after):
                    return True
        if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            break
        node = a
    return False


# ------------------------------------------------------------------- does the file train?
# A call that is a training step wherever it stands: a backward pass, an optimizer's step,
# a framework's (``trainer.fit``, ``model.train_step``, TF-style ``minimize``).
STEP_ATTRS = frozenset({"backward", "step", "minimize", "fit", "train_step", "optimize_parameters"})
GRAD_CALLS = frozenset({"torch.autograd.backward", "torch.autograd.grad"})


def _is_step(m: SemanticModel, call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr in STEP_ATTRS) or m.is_name(f, GRAD_CALLS)


class TrainingSite(NamedTuple):
    """Where a module trains: ``line`` of its call; ``where``: ``""`` for a step in the
    module itself, else ``module.py:N``, the step in the project code that call reaches."""

    line: int
    where: str


def training_site(m: SemanticModel) -> Optional[TrainingSite]:
    """The first place this module trains (``None``: nowhere): a training step in its own
    code (:data:`STEP_ATTRS`, ``torch.autograd.grad``), or a call of the project's own code
    (a function, a class, a method of a project object, also one held first:
    ``trainer = model.train; trainer(args)``) whose run reaches a backward pass in a project module
    (up to three modules further: :func:`dp2ddp.model.project_defs.reach_across`). Only a
    module with no such site is inference-only (DDP115)."""
    if "training:site" in m.cache:
        return m.cache["training:site"]  # type: ignore[return-value]
    got: Optional[TrainingSite] = None
    own = next((c for c in m.nodes(ast.Call) if _is_step(m, c)), None)
    if own is not None:
        got = TrainingSite(own.lineno, "")
    else:
        got = _project_site(m)
    m.cache["training:site"] = got
    return got


def _project_site(m: SemanticModel) -> Optional[TrainingSite]:
    from dp2ddp.model.flow import origins
    from dp2ddp.model.project_defs import class_of_call, method_of, project_calls, reach_across

    found = [(call, hit) for call, hit in project_calls(m)]
    seen = {id(call) for call, _ in found}
    for call in m.nodes(ast.Call):  # a project method held by a name first: ``trainer = model.train``
        if id(call) in seen or not isinstance(call.func, ast.Name):
            continue
        for node, path in origins(m, call.func):
            hit = project_def(m, node) if not path and isinstance(node, (ast.Name, ast.Attribute)) else None
            if hit is not None and not isinstance(hit[1], ast.ClassDef):
                found.append((call, hit))
                break
            made = class_of_call(m, node) if not path and isinstance(node, ast.Call) else None
            if made is not None and made[2]:  # an object of a project class, called: its ``__call__``
                # (``compute_loss_fct = MultipleChoiceLossCompute(crit, crit, coef, opt)``, then
                # ``compute_loss_fct(X, Y, M, logits)`` backward and steps in loss.py)
                method = method_of(made[0], made[1], "__call__", made[2])
                if method is not None:
                    found.append((call, method))
                    break
    for call in m.nodes(ast.Call):  # ``trainer.train(loader)``, ``trainer`` one of two project classes
        if id(call) not in seen and isinstance(call.func, ast.Attribute):
            found.extend((call, hit) for hit in project_defs(m, call.func))
    from dp2ddp.model.steps import is_backward as backward

    for call, (pm, node, rel) in sorted(found, key=lambda t: (t[0].lineno, t[0].col_offset)):
        for mod, fn, path in reach_across(pm, node, rel):
            # in the project's code only a backward pass: a ``.step()`` there may be a
            # scheduler's, ``torch.autograd.grad`` may tune a number (a temperature), not train
            step = next((c for c in ast.walk(fn) if isinstance(c, ast.Call) and backward(mod, c)), None)
            if step is not None:
                return TrainingSite(call.lineno, f"{path}:{step.lineno}")
    return None
