"""Losses that compare the samples of a batch with each other.

A contrastive loss (SupCon, NT-Xent, InfoNCE with in-batch negatives) builds a similarity
matrix of the batch's features, ``torch.matmul(features, features.T)``. Under DataParallel
the loss runs on the gathered outputs: every sample meets every other. Under DDP each
process computes it on its own share, so each sample meets half the negatives (with two
processes) and the loss is another loss: the migration would train a different model while
exiting 0. A loss that gathers the features of every rank itself (``dist.all_gather``, a
``GatherLayer``) is the script's own answer and is left alone.

:func:`in_batch_losses` finds them: the callables a training loop reaches (functions of the
script, and losses of the project's own modules: functions and ``nn.Module`` classes called
or instantiated in it) whose body multiplies a tensor by the transpose of a local tensor
(``a @ b.T``, ``torch.matmul(a, b.t())``, ``torch.mm(a, b.transpose(0, 1))``) or takes
``torch.cdist`` between local tensors. Only callables whose name says they are a loss
(``...loss...``, ``criterion``, ``NTXent``/``nt_xent``, ``contrastive``, ``InfoNCE``) are
read: a model's own ``x @ self.weight.T`` is not a comparison of samples.
"""

from __future__ import annotations

import ast
import re
from typing import Iterator, List, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.project_defs import project_def

_LOSS_NAME = re.compile(r"loss|criterion|xent|contrast|infonce|simclr|supcon|triplet|ntx", re.I)
_MATMUL = {"matmul", "mm", "einsum_pairs"}
_GATHER = re.compile(r"all_gather|GatherLayer|gather_from_all|concat_all_gather|all_reduce", re.I)


def _transposed_local(node: ast.AST) -> bool:
    """``x.T``, ``x.t()``, ``x.transpose(0, 1)``, ``x.permute(1, 0)`` of a local name."""
    base: Optional[ast.AST] = None
    if isinstance(node, ast.Attribute) and node.attr == "T":
        base = node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        attr = node.func.attr
        args = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if attr == "t" and not node.args:
            base = node.func.value
        elif attr in ("transpose", "permute") and sorted(args) == [0, 1] and len(node.args) == 2:
            base = node.func.value
    return isinstance(base, ast.Name) and base.id != "self"


def _pairwise(node: ast.AST) -> bool:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return _transposed_local(node.right)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in _MATMUL and len(node.args) == 2:
            return _transposed_local(node.args[1])
        if name == "cdist" and len(node.args) >= 2:
            return all(isinstance(a, ast.Name) for a in node.args[:2])
    return False


def _comparison_in(func: ast.AST) -> Optional[ast.AST]:
    src_gathers = False
    found = None
    for n in ast.walk(func):
        if isinstance(n, (ast.Name, ast.Attribute)):
            text = n.id if isinstance(n, ast.Name) else n.attr
            if _GATHER.search(text):
                src_gathers = True
        if found is None and _pairwise(n):
            found = n
    return None if src_gathers else found


def _bodies(pm: SemanticModel, node: ast.AST) -> Iterator[ast.AST]:
    """The function itself, or a class's ``forward`` / ``__call__``."""
    if isinstance(node, ast.ClassDef):
        for stmt in node.body:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in ("forward", "__call__"):
                yield stmt
    else:
        yield node


def _project_callable(m: SemanticModel, call: ast.Call):
    """The project's def or class a call runs: named directly (``SupConLoss(...)(x)``,
    ``losses.nt_xent(z)``) or through the value it calls (``criterion = SupConLoss(...)``,
    also returned by a setup function of the script)."""
    from dp2ddp.model.flow import origins

    found = project_def(m, call.func)
    if found is not None:
        return found
    if not isinstance(call.func, (ast.Name, ast.Attribute)):
        return None
    for node, path in origins(m, call.func):
        if isinstance(node, ast.Call) and not path:
            found = project_def(m, node.func)
            if found is not None and isinstance(found[1], ast.ClassDef):
                return found
    return None


def in_batch_losses(m: SemanticModel) -> List[Tuple[ast.AST, str, int, str]]:
    """``(call in the script, file, line, name)`` for each loss the training loops reach that
    compares the samples of the batch with each other without gathering every rank's."""
    from dp2ddp.model.training import training_loops

    got = m.cache.get("batch_coupling:in_batch_losses")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.AST, str, int, str]] = []
    seen: Set[int] = set()
    for loop in training_loops(m):
        for func in m.reach(loop):
            name = getattr(func, "name", "")
            if func is not loop and isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and _LOSS_NAME.search(name):
                hit = _comparison_in(func)
                if hit is not None and id(func) not in seen:
                    seen.add(id(func))
                    out.append((func, "", hit.lineno, name))
        for call in m.reached_calls(loop):
            found = _project_callable(m, call)
            if found is None:
                continue
            pm, node, rel = found
            if not _LOSS_NAME.search(node.name) or id(node) in seen:  # type: ignore[attr-defined]
                continue
            for body in _bodies(pm, node):
                hit = _comparison_in(body)
                if hit is not None:
                    seen.add(id(node))
                    out.append((call, rel, hit.lineno, node.name))  # type: ignore[attr-defined]
                    break
    m.cache["batch_coupling:in_batch_losses"] = out
    return out


def loss_calls(m: SemanticModel, node: ast.AST) -> Optional[List[ast.Call]]:
    """The calls of an in-batch loss (``node``: a call of a project loss, or a loss
    function of this module) whose inputs the migration can gather: every argument is a
    name the loop around the call assigns (a value of the training step, not a parameter or
    a module-level value that may carry state) or a constant; ``None``
    where one is not (state such as a queue of negatives, ``*args``) or no call is found."""
    from dp2ddp.model.steps import names_bound

    calls = [node] if isinstance(node, ast.Call) else list(m.call_sites(node))
    if not calls:
        return None
    for call in calls:
        args = list(call.args) + [k.value for k in call.keywords if k.arg is not None]
        if not args or len(args) != len(call.args) + len(call.keywords):
            return None
        loops = m.enclosing_loops(call)
        if not loops:
            return None
        local = names_bound(m, loops[0])
        for a in args:
            if isinstance(a, ast.Constant):
                continue
            if not (isinstance(a, ast.Name) and a.id in local):
                return None
    return calls
