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

A loss that divides totals over the whole batch (a Dice, IoU or Tversky loss:
``(2 * torch.sum(p * t) + s) / (torch.sum(p * p) + torch.sum(t * t) + s)``) couples the
samples the same way: the ratio of the batch's totals is not the mean of the ranks'
ratios. A total is a ``sum``/``mean`` over every element (no ``dim``) of a tensor of the
call (not of ``self``); per-sample ratios (``.sum(dim=(1, 2))``) averaged over the batch are
means and are not reported.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.project_defs import class_of_call, path_of, project_def, returned_callables
from dp2ddp.model.call_args import argument
from dp2ddp.model.syntax import FUNCTIONS, summing_keyword, unplaced

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


def _state(node: ast.AST) -> bool:
    """``self.m_list[None, :]``, ``self.prototypes.weight``: the module's own state, not the batch."""
    base = node
    while isinstance(base, (ast.Attribute, ast.Subscript, ast.Call)):
        base = base.func if isinstance(base, ast.Call) else base.value
    return isinstance(base, ast.Name) and base.id == "self"


def _pairwise(node: ast.AST) -> bool:
    """``a @ b.T`` (``torch.matmul(a, b.t())``, ``addmm``, ``cdist``) of two batch values: every
    sample against every other. A left operand that is the module's state (``self.m_list[None, :]
    @ onehot.T``: a per-class margin picked for each sample) compares nothing."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return _transposed_local(node.right) and not _state(node.left)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in _MATMUL and len(node.args) == 2:
            return _transposed_local(node.args[1]) and not _state(node.args[0])
        if name in ("addmm", "addmm_") and node.args:  # ``dist.addmm_(x, y.t(), beta=1, alpha=-2)``, old ``addmm_(1, -2, x, y.t())``
            return _transposed_local(node.args[-1])
        if name == "cdist" and len(node.args) >= 2:
            return all(isinstance(a, ast.Name) for a in node.args[:2])
    return False


_TOTALS = {"sum", "mean"}


def _whole_total(node: ast.AST) -> bool:
    """``torch.sum(x)``, ``x.sum()``, ``torch.mean(x)``, ``x.mean()``: every element, no
    ``dim``, of a tensor that is not the module's own state (``self.weight.sum()``); or a
    loss summed over its samples (``F.smooth_l1_loss(p, t, size_average=False)``)."""
    if isinstance(node, ast.Call) and summing_keyword(node) is not None:
        return True
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute) or node.func.attr not in _TOTALS:
        return False
    if any(k.arg in ("dim", "axis") for k in node.keywords):
        return False
    on = node.func.value
    if isinstance(on, ast.Name) and on.id in ("torch", "np", "numpy"):
        if len(node.args) != 1:
            return False
        on = node.args[0]
    elif node.args:
        return False
    base = on
    while isinstance(base, (ast.Attribute, ast.Subscript)):
        base = base.value
    return not (isinstance(base, ast.Name) and base.id == "self")


def _holds_total(e: ast.AST, assigned: dict, depth: int = 0) -> bool:
    """A total over the batch is in ``e``, or in what a local name of it was assigned once."""
    if depth > 6:
        return False
    for n in ast.walk(e):
        if _whole_total(n):
            return True
        if isinstance(n, ast.Name) and n.id in assigned:
            if _holds_total(assigned[n.id], assigned, depth + 1):
                return True
    return False


def _ratio_of_totals(func: ast.AST) -> Optional[ast.AST]:
    """The first ``a / b`` (or ``a /= b``) in ``func`` whose numerator and denominator each
    hold a total over the whole batch (:func:`_whole_total`, followed through local names
    assigned once: ``loss_l = F.smooth_l1_loss(..., size_average=False)``, ``N =
    num_pos.sum()``, ``loss_l /= N``, the count normalisation of a detection loss)."""
    counts: dict = {}
    values: dict = {}
    for n in ast.walk(func):
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, (ast.AnnAssign, ast.For)) else []
        for t in targets:
            for name in ast.walk(t):
                if isinstance(name, ast.Name):
                    counts[name.id] = counts.get(name.id, 0) + 1
                    values[name.id] = n.value if isinstance(t, ast.Name) and not isinstance(n, ast.For) else None
    assigned = {k: v for k, v in values.items() if counts[k] == 1 and v is not None}
    for n in ast.walk(func):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            top, bottom = n.left, n.right
        elif isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div):
            top, bottom = n.target, n.value
        else:
            continue
        if _holds_total(top, assigned) and _holds_total(bottom, assigned):
            return n
    return None


def _comparison_in(func: ast.AST, m: Optional[SemanticModel] = None, depth: int = 0) -> Optional[Tuple[ast.AST, str]]:
    """Where ``func`` couples the samples of its batch, and how (for a message); ``None``
    where it gathers every rank's share itself. With ``m`` (the model of ``func``'s module),
    the module's functions it calls are read too, two calls deep (the batch-hard triplet
    loss whose distance matrix a helper computes: ``dist = euclidean_dist(feat, feat)``)."""
    src_gathers = False
    found = None
    for n in ast.walk(func):
        if isinstance(n, (ast.Name, ast.Attribute)):
            text = n.id if isinstance(n, ast.Name) else n.attr
            if _GATHER.search(text):
                src_gathers = True
        if found is None and _pairwise(n):
            found = (n, COMPARES)
        if found is None and m is not None and depth < 2 and isinstance(n, ast.Call):
            helper = m.resolve_call(n)
            if isinstance(helper, (ast.FunctionDef, ast.AsyncFunctionDef)) and helper is not func:
                inner = _comparison_in(helper, m, depth + 1)
                if inner is not None and inner[1] == COMPARES:
                    found = inner
    if found is None:
        ratio = _ratio_of_totals(func)
        found = None if ratio is None else (ratio, DIVIDES)
    return None if src_gathers else found


COMPARES = "compares the samples of a batch with each other"
DIVIDES = "divides totals over the whole batch (a ratio of sums, as a Dice or IoU loss takes)"


def bodies_when_called(pm: SemanticModel, node: ast.AST) -> Iterator[ast.AST]:
    """The function itself, or a class's ``forward`` / ``__call__`` and the methods of the
    class they call (``self._dice_loss(...)``), followed through the methods those call."""
    if not isinstance(node, ast.ClassDef):
        yield node
        return
    methods = {s.name: s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
    todo = [methods[n] for n in ("forward", "__call__") if n in methods]
    done: Set[str] = set()
    while todo:
        f = todo.pop(0)
        if f.name in done:
            continue
        done.add(f.name)
        yield f
        for n in ast.walk(f):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                    and n.func.value.id == "self" and n.func.attr in methods):
                todo.append(methods[n.func.attr])


def project_callables(m: SemanticModel, call: ast.Call) -> List[Tuple[SemanticModel, ast.AST, str]]:
    """The project's def or class a call runs, or a class of this module: named directly
    (``SupConLoss(...)(x)``, ``losses.nt_xent(z)``) or through the value it calls
    (``criterion = SupConLoss(...)``, also returned by a setup function of the script, also
    placed: ``.cuda()``); every class a project factory may pick by name
    (``losses.create(args.loss)``: :func:`dp2ddp.model.project_defs.returned_callables`)."""
    from dp2ddp.model.flow import origins

    found = project_def(m, call.func) or class_of_call(m, call)
    if found is not None:
        return [found]
    if not isinstance(call.func, (ast.Name, ast.Attribute)):
        return []
    out: List[Tuple[SemanticModel, ast.AST, str]] = []
    for node, path in origins(m, call.func):  # every class the value may hold (``criterion`` chosen
        node = unplaced(node)                 # on if/elif paths), each examined
        if isinstance(node, ast.Call) and not path:
            found = project_def(m, node.func) or class_of_call(m, node)
            if found is not None and isinstance(found[1], ast.ClassDef):
                out.append(found)
            elif found is not None and isinstance(found[1], FUNCTIONS):
                out.extend(returned_callables(*found))
    seen = set()
    return [f for f in out if not (id(f[1]) in seen or seen.add(id(f[1])))]


class InBatchLoss(NamedTuple):
    """A loss the training reaches that couples the samples of its batch."""

    node: ast.AST  # the call in the script (a project loss), or the loss function of this module
    rel: str  # the project module that defines it ("" for this module)
    line: int  # the comparison or the ratio of totals
    name: str
    how: str  # COMPARES or DIVIDES
    entry: ast.AST  # the def the call binds its arguments to: the function, or the class's forward/__call__


def _positional(entry: ast.AST) -> List[str]:
    args = [a.arg for a in getattr(entry, "args", ast.arguments(args=[])).args]
    return args[1:] if args and args[0] == "self" else args


def taken_apart(entry: ast.AST) -> Dict[str, int]:
    """Parameters of a loss's ``entry`` that it takes apart as a sequence, not one tensor of
    the batch: unpacked (``loc, conf, priors = predictions``) or indexed by a constant
    (``predictions[0]``); name -> line. (Looping over a tensor or taking its ``len()`` reads
    its samples: a tensor of the batch still.)"""
    params = set(_positional(entry))
    out: Dict[str, int] = {}

    def mark(node: ast.AST, line: int) -> None:
        if isinstance(node, ast.Name) and node.id in params:
            out.setdefault(node.id, line)

    for n in ast.walk(entry):
        if isinstance(n, ast.Assign) and any(isinstance(t, (ast.Tuple, ast.List)) for t in n.targets):
            mark(n.value, n.lineno)
        elif isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, int):
            mark(n.value, n.lineno)
    return out


def ungatherable(loss: InBatchLoss, call: ast.Call) -> Optional[str]:
    """Why ``call``'s inputs cannot each be gathered as one tensor of the batch: an argument
    the loss takes apart as a sequence (a tuple of outputs, a list of per-image targets)."""
    params = _positional(loss.entry)
    apart = taken_apart(loss.entry)
    for p in params:
        line = apart.get(p)
        a = argument(call, params, p)
        if line is not None and a is not None:
            where = f"{loss.rel}:{line}" if loss.rel else f"line {line}"
            return (f"its `{p}` (`{ast.unparse(a)}` here) is taken apart as a sequence ({where}), not one tensor of "
                    "the batch that could be gathered")
    return None


def in_batch_losses(m: SemanticModel) -> List[InBatchLoss]:
    """Each loss the training loops reach that couples the samples of the batch (compares
    them with each other, or divides totals over the whole batch; ``how`` says which)
    without gathering every rank's."""
    from dp2ddp.model.training import training_loops

    got = m.cache.get("batch_coupling:in_batch_losses")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[InBatchLoss] = []
    seen: Set[int] = set()
    for loop in training_loops(m):
        reached = set(m.reach(loop))
        calls = list(m.reached_calls(loop))  # read once: the closures' calls, then the project's losses
        for call in calls:
            if m.resolve_call(call) is None:
                for closure in _closures(m, call):  # ``loss_fn(out, y)``, a closure a loss factory returned
                    reached |= m.reach(closure)
        for func in sorted(reached, key=lambda f: (getattr(f, "lineno", 0), getattr(f, "col_offset", 0))):
            name = getattr(func, "name", "")
            if func is not loop and isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and _LOSS_NAME.search(name):
                hit = _comparison_in(func, m)
                if hit is not None and id(func) not in seen:
                    seen.add(id(func))
                    out.append(InBatchLoss(func, "", hit[0].lineno, name, hit[1], func))
        for call in calls:
            for pm, node, rel in project_callables(m, call):
                if not _LOSS_NAME.search(node.name) or id(node) in seen:  # type: ignore[attr-defined]
                    continue
                hit = next((h for h in (_comparison_in(body, pm) for body in bodies_when_called(pm, node)) if h is not None), None)
                if hit is not None:
                    seen.add(id(node))
                    entry = next(bodies_when_called(pm, node))
                    out.append(InBatchLoss(call, rel, hit[0].lineno, node.name, hit[1], entry))  # type: ignore[attr-defined]
                    break
    m.cache["batch_coupling:in_batch_losses"] = out
    return out


def _closures(m: SemanticModel, call: ast.Call) -> List[ast.AST]:
    """The functions of this module a call of a value runs (``loss_fn(out, y)`` where
    ``loss_fn`` is what ``make_loss()`` returned: its nested ``def loss_func``), found by
    value flow; every value must be such a ``def``."""
    from dp2ddp.model.flow import origins

    if not isinstance(call.func, ast.Name):
        return []
    out: List[ast.AST] = []
    for node, path in origins(m, call.func):
        if path or not isinstance(node, ast.Name) or node is call.func:
            return []
        _, bindings = m.lookup(node.id, m.scope_of(node))
        defs = [b.node for b in bindings if isinstance(b.node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if not defs or len(defs) != len(bindings):
            return []
        out.extend(defs)
    return out


def coupling_when_called(pm: SemanticModel, node: ast.AST, rel: str, depth: int = 0) -> Optional[Tuple[str, str, str]]:
    """``(name, where, how)`` when calling ``node`` (a function or a loss class of module
    ``pm``) compares the batch's samples: in its body or the module's functions it calls, or
    in a project loss it calls (``triplet = TripletLoss(m)`` ... ``triplet(feat, y)``)."""
    cls = pm.enclosing_class(node) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    name = cls.name if cls is not None and node.name in ("__call__", "forward") else getattr(node, "name", "")  # type: ignore[attr-defined]
    if depth > 3 or not _LOSS_NAME.search(name):
        return None
    for body in bodies_when_called(pm, node):
        hit = _comparison_in(body, pm)
        if hit is not None:
            return name, f"{rel}:{hit[0].lineno}" if rel else f"line {hit[0].lineno}", hit[1]
        for call in (n for n in ast.walk(body) if isinstance(n, ast.Call)):
            for found in project_callables(pm, call):  # every class a factory may pick
                got = None if found[1] is node else coupling_when_called(found[0], found[1], path_of(found, pm, rel), depth + 1)
                if got is not None:
                    return got
    return None


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
