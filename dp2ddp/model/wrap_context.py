"""Where a DataParallel wrap stands, as the migration needs to know it.

* :func:`returned_wraps` / :func:`project_wrapper_returns`: wraps a function returns
  (``return DataParallel(model)``), and the script's calls of such project functions;
* :func:`fresh_each_pass`: a wrap in a loop of a model made in the same pass (one model per
  fold or seed);
* :func:`in_exiting_branch`: a wrap in an ``if`` branch that ends the program without
  training (``if args.test_only: ...; sys.exit(0)``).
"""

from __future__ import annotations

import ast
from typing import List

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.project_defs import project_calls
from dp2ddp.model.syntax import FUNCTIONS
from dp2ddp.model.wraps import Wrap, dp_wraps


def returned_wraps(m: SemanticModel, func: ast.AST) -> List[Wrap]:
    """The DataParallel wraps of ``func`` whose wrapper it returns (``return model`` after
    ``model = DataParallel(model)``, or ``return DataParallel(model)``)."""
    out = []
    for w in dp_wraps(m):
        if w.functional or w.function is not func:
            continue
        for r in ast.walk(func):
            if not isinstance(r, ast.Return) or r.value is None or m.enclosing_function(r) is not func:
                continue
            values = r.value.elts if isinstance(r.value, ast.Tuple) else [r.value]
            if any(v is w.outer or (w.target is not None and m.source(v) == m.source(w.target)) for v in values):
                out.append(w)
                break
    return out


def project_wrapper_returns(m: SemanticModel) -> List[ast.Call]:
    """Calls of this script to a function of a project module that returns a DataParallel
    wrapper (``model = models.build(args)``), with whether one GPU ran without it:
    ``[(call, guarded)]``, guarded where every wrap it returns stands under a count of the
    devices (``if torch.cuda.device_count() > 1:``) that a one-GPU machine fails, as a wrap of
    the script is judged (:func:`~dp2ddp.model.cuda_only.one_gpu_ran_bare`). A wrap on both branches
    of ``if cuda:`` ran everywhere: its checkpoints had ``module.`` keys."""
    from dp2ddp.model.cuda_only import one_gpu_ran_bare

    got = m.cache.get("wraps:project_returns")
    if got is not None:
        return got  # type: ignore[return-value]
    out = []
    for call, (pm, func, _rel) in project_calls(m):
        if isinstance(func, ast.ClassDef):
            continue
        ws = returned_wraps(pm, func)
        if ws:
            out.append((call, all(one_gpu_ran_bare(pm, [c.test for c in w.conditions]) for w in ws)))
    m.cache["wraps:project_returns"] = out
    return out  # type: ignore[return-value]


def fresh_each_pass(m: SemanticModel, w: Wrap) -> bool:
    """A wrap inside a loop that wraps a model made in the same pass, before training it
    (k-fold cross-validation, one model per seed or per task): each pass builds its own
    DistributedDataParallel, which every rank constructs together (the loop runs alike on
    every rank). Not fresh: a wrap in the loop that trains (its own statements call
    ``.backward()``), or of a model that outlives the pass."""
    from dp2ddp.model.syntax import LOOPS
    from dp2ddp.model.steps import own_nodes

    loop = next((a for a in m.ancestors(w.stmt) if isinstance(a, LOOPS + FUNCTIONS + (ast.ClassDef, ast.Module))), None)
    if not isinstance(loop, LOOPS) or w.module is None or w.target is None:
        return False
    body_calls = [n for n in own_nodes(m, loop) if isinstance(n, ast.Call)
                  and not any(isinstance(a, LOOPS) and a is not loop for a in _between(m, n, loop))]
    if any(isinstance(c.func, ast.Attribute) and c.func.attr == "backward" for c in body_calls):
        return False  # the wrap runs in the training step itself
    made = w.module
    while isinstance(made, ast.Call) and isinstance(made.func, ast.Attribute) and made.func.attr in ("to", "cuda", "float", "half"):
        made = made.func.value
    if isinstance(made, ast.Call):
        return True
    if isinstance(made, ast.Name):
        return any(
            isinstance(n, ast.Assign) and n.lineno < w.stmt.lineno
            and any(isinstance(t, ast.Name) and t.id == made.id for tgt in n.targets for t in ast.walk(tgt))
            for n in own_nodes(m, loop)
        )
    return False


def _between(m: SemanticModel, node: ast.AST, top: ast.AST):
    for a in m.ancestors(node):
        if a is top:
            return
        yield a


def in_exiting_branch(m: SemanticModel, w: Wrap) -> bool:
    """The wrap is in an ``if`` branch that ends the program (or its function) without
    training: ``if args.test_only: ...; net = DataParallel(net); <evaluate>; sys.exit(0)``."""
    from dp2ddp.model.ranks import is_exit
    from dp2ddp.model.training import is_backward, trains

    for a in m.ancestors(w.stmt):
        if isinstance(a, FUNCTIONS + (ast.ClassDef, ast.Lambda)):
            return False
        if not (isinstance(a, ast.If) and any(s is w.stmt or m.contains(s, w.stmt) for s in a.body)):
            continue
        last = a.body[-1]
        ends = isinstance(last, (ast.Return, ast.Raise)) and (
            not isinstance(last, ast.Raise) or "SystemExit" in m.source(last))
        if isinstance(last, ast.Return) and m.enclosing_function(last) is None:
            ends = False
        if is_exit(last):
            ends = True
        if ends:
            body_calls = [c for s in a.body for c in ast.walk(s) if isinstance(c, ast.Call)]
            return not any(is_backward(c) for c in body_calls) and not any(trains(m, s) for s in a.body)
    return False
