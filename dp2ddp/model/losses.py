"""Losses whose scale depends on how the batch is split.

A ``reduction="sum"`` loss (a ``torch.nn`` loss class or functional) adds up over the
samples a process sees. DataParallel computes it over the whole batch; under DDP each
process sums its share and the gradients are *averaged* across processes, so every step
is 1/world_size of DataParallel's. A summed loss divided by the size of its batch where it
is computed (``F.mse_loss(out, y, reduction="sum") / (x.size(0) * 2)``, the DnCNN shape) is a
mean: each rank's share is as large as every other's, so the average of the ranks' means
is the original's mean, and nothing is reported.
"""

from __future__ import annotations

import ast
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

from dp2ddp.model.batch_counts import data_count
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.loss_calls import bound_to, class_uses, shared_binding, trains_here
from dp2ddp.model.syntax import first_dim_of, kwarg, summing_keyword
from dp2ddp.model.training import under_no_grad


class SumLoss(NamedTuple):
    """A use of a summed ``torch.nn`` loss in training. ``scalable``: every backward it
    reaches differentiates a sum of summed losses (times factors the same on every rank),
    so multiplying each by the world size gives DataParallel's step exactly (DDP averages
    the ranks' gradients of their shares' sums); else ``reason`` says what stands in the
    way: another term of the loss, or no backward dp2ddp can follow it to."""

    arg: ast.AST  # reduction="sum" / size_average=False, or the project's loss class that returns a total
    made: ast.Call  # the loss class's construction, or the functional call
    use: ast.Call  # the call that computes it
    scalable: bool
    reason: str


def what_sums(m: SemanticModel, arg: ast.AST) -> str:
    """How a :class:`SumLoss` sums, for a message: its argument, or its class's total."""
    if isinstance(arg, ast.ClassDef):
        forward = m.methods(arg).get("forward")
        where = m.cache.get("losses:class-files", {}).get(id(arg))
        some = " on one path" if not_a_total(m, arg) is not None else ""
        return (f"{arg.name}.forward returns a total{some}, {where[1] + ' ' if where else ''}"
                f"line {getattr(forward, 'lineno', arg.lineno)}")
    return m.source(arg)


def _made_sums(m: SemanticModel) -> List[Tuple[ast.Call, ast.AST, bool]]:
    """(where a summing loss is made, what makes it sum, functional): ``torch.nn`` losses
    with ``reduction="sum"``/``size_average=False``, any other callee outside torch given
    ``reduction="sum"`` (a loss function held on ``self``, a project's loss), and instances of this module's loss
    classes whose ``forward`` returns the total of an elementwise expression of its inputs
    (``torch.sum(torch.sqrt(diff * diff + self.eps))``, the Charbonnier loss of
    super-resolution code)."""
    got = m.cache.get("losses:made")
    if got is not None:
        return got  # type: ignore[return-value]
    totals = _total_classes(m)
    out: List[Tuple[ast.Call, ast.AST, bool]] = []
    for made in m.nodes(ast.Call):
        arg = summing_keyword(made)
        names = m.qualified_names(made.func)
        if arg is not None and any(q.startswith("torch.nn.") for q in names):
            out.append((made, arg, any(q.startswith("torch.nn.functional.") for q in names)))
        elif arg is not None and kwarg(made, "reduction") is arg and not any(q.startswith("torch.") for q in names):
            # a callee dp2ddp cannot name (``loss_func = self.loss_func``, a project's loss)
            # given torch's ``reduction="sum"``: a sum; called on data, it computes the loss
            out.append((made, arg, bool(made.args)))
        elif isinstance(made.func, ast.Name) and made.func.id in totals:
            cls = totals[made.func.id]
            _, bindings = m.lookup(made.func.id, m.scope_of(made))
            if [b.node for b in bindings] == [cls]:
                out.append((made, cls, False))
        elif isinstance(made.func, (ast.Name, ast.Attribute)) and bound_to(m, made) is not None:
            cls = _project_total_class(m, made)
            if cls is not None:
                out.append((made, cls, False))
    m.cache["losses:made"] = out
    return out


def _project_total_class(m: SemanticModel, made: ast.Call) -> Optional[ast.ClassDef]:
    """``criterion = SumLoss()`` where ``SumLoss`` is a loss class of one of the project's
    own modules (``from losses import SumLoss``) whose ``forward`` returns a total."""
    from dp2ddp.model.project_defs import project_def

    names = m.qualified_names(made.func)
    if not names or any(q.split(".", 1)[0] in ("torch", "builtins") for q in names):
        return None
    got = project_def(m, made.func)
    if got is None or not isinstance(got[1], ast.ClassDef) or got[0] is m:
        return None
    cls = _total_classes(got[0]).get(got[1].name)
    if cls is not got[1]:
        return None
    m.cache.setdefault("losses:class-files", {})[id(cls)] = (got[0], got[2])  # type: ignore[index]
    return cls


_ELEMENTWISE = frozenset({"sqrt", "abs", "exp", "log", "pow", "square", "log1p", "sigmoid", "add", "sub", "mul", "div"})


def _total_classes(m: SemanticModel) -> Dict[str, ast.ClassDef]:
    """This module's loss classes whose ``forward`` returns a total over the samples: every
    return (:func:`_total_of`), or some of them (:func:`not_a_total` says which return is
    not: such a class's use is refused, not scaled)."""
    from dp2ddp.model.kinds import is_module_class

    got = m.cache.get("losses:totals")
    if got is not None:
        return got  # type: ignore[return-value]
    out = {}
    partial: Dict[int, ast.AST] = m.cache.setdefault("losses:partial", {})  # type: ignore[assignment]
    for cls in m.nodes(ast.ClassDef):
        if not is_module_class(m, cls) or m.enclosing_function(cls) is not None:
            continue
        forward = m.methods(cls).get("forward")
        if forward is None:
            continue
        params = {a.arg for a in forward.args.args[1:]}
        returns = [n.value for n in ast.walk(forward) if isinstance(n, ast.Return) and n.value is not None]
        totals = [r for r in returns if params and _total_of(m, r, params)]
        if totals:
            out[cls.name] = cls
            other = next((r for r in returns if r not in totals), None)
            if other is not None:
                partial[id(cls)] = other
    m.cache["losses:totals"] = out
    return out


def not_a_total(m: SemanticModel, cls: ast.ClassDef) -> Optional[ast.AST]:
    """A return of a total class's ``forward`` that is no total (a mean on another path),
    the class being this module's or a project module's a call of this module makes."""
    _total_classes(m)
    partial: Dict[int, ast.AST] = m.cache["losses:partial"]  # type: ignore[assignment]
    if id(cls) in partial:
        return partial[id(cls)]
    where = m.cache.get("losses:class-files", {}).get(id(cls))
    return not_a_total(where[0], cls) if where is not None else None


def _total_of(m: SemanticModel, e: ast.AST, params: Set[str], depth: int = 0) -> bool:
    """``torch.sum(x)`` or ``x.sum()`` (every element) of an elementwise expression of
    ``params`` (and constants, ``self.`` attributes); a summing ``torch.nn`` loss of them
    (``F.cross_entropy(logits, target, reduction="sum")``, or ``self.crit(...)`` made in
    ``__init__`` as ``nn.MSELoss(reduction="sum")``); such totals added up, or times a
    factor the same on every rank (``self.weight * ...``)."""
    e = _local_value(m, e)
    if depth > 8:
        return False
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        return _total_of(m, e.left, params, depth + 1) and _total_of(m, e.right, params, depth + 1)
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult) and _rank_constant(m, e.left):
        return _total_of(m, e.right, params, depth + 1)
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Mult, ast.Div)) and _rank_constant(m, e.right):
        return _total_of(m, e.left, params, depth + 1)
    if isinstance(e, ast.Call) and _summing_loss_call(m, e):
        met: Set[str] = set()
        return all(_elementwise_of(m, a, params, met) for a in e.args) and bool(met)
    if isinstance(e, ast.Call) and not e.keywords:
        if m.is_name(e.func, {"torch.sum"}) and len(e.args) == 1:
            inner = e.args[0]
        elif isinstance(e.func, ast.Attribute) and e.func.attr == "sum" and not e.args:
            inner = e.func.value
        else:
            return False
        return _elementwise(m, inner, params)
    return False


def _summing_loss_call(m: SemanticModel, call: ast.Call) -> bool:
    """A ``torch.nn`` loss that sums: the functional given ``reduction="sum"``, or
    ``self.<attr>(...)`` where the class (its family) assigns ``self.<attr>`` once, a summing
    ``torch.nn`` loss class."""
    if summing_keyword(call) is not None:
        return any(q.startswith("torch.nn.functional.") for q in m.qualified_names(call.func))
    from dp2ddp.model.stores import attribute_assignments

    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"):
        return False
    cls = m.enclosing_class(m.enclosing_function(call))
    made = attribute_assignments(m, cls).get(f.attr, []) if cls is not None else []
    return len(made) == 1 and isinstance(made[0], ast.Call) and summing_keyword(made[0]) is not None and any(
        q.startswith("torch.nn.") and not q.startswith("torch.nn.functional.") for q in m.qualified_names(made[0].func))


def _local_value(m: SemanticModel, e: ast.AST) -> ast.AST:
    """What a local name of a ``forward`` holds, where it is assigned once (``diff = x - y``)."""
    for _ in range(8):
        if not isinstance(e, ast.Name):
            return e
        _, bindings = m.lookup(e.id, m.scope_of(e))
        if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].value is None:
            return e
        e = bindings[0].value
    return e


def _elementwise(m: SemanticModel, e: ast.AST, params: Set[str]) -> bool:
    """An expression of ``params`` (at least one of them) element by element."""
    met: Set[str] = set()
    return _elementwise_of(m, e, params, met) and bool(met)


def _elementwise_of(m: SemanticModel, e: ast.AST, params: Set[str], met: Set[str], depth: int = 0) -> bool:
    """``e`` is elementwise over ``params``, constants and ``self.`` attributes (local names
    followed to what they hold); the parameters it reads go to ``met``."""
    if depth > 16:
        return False
    e = _local_value(m, e) if not (isinstance(e, ast.Name) and e.id in params) else e
    d = depth + 1
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
        return _elementwise_of(m, e.left, params, met, d) and _elementwise_of(m, e.right, params, met, d)
    if isinstance(e, ast.UnaryOp):
        return _elementwise_of(m, e.operand, params, met, d)
    if isinstance(e, ast.Constant):
        return isinstance(e.value, (int, float))
    if isinstance(e, ast.Name):
        if e.id in params:
            met.add(e.id)
            return True
        return False
    if isinstance(e, ast.Attribute):
        return isinstance(e.value, ast.Name) and e.value.id == "self"
    if isinstance(e, ast.Call) and not e.keywords:
        f = e.func
        if (isinstance(f, ast.Attribute) and f.attr in _ELEMENTWISE
                and not (isinstance(f.value, ast.Name) and m.is_imported(f.value))):  # a tensor's method, ``mu.pow(2)``
            return _elementwise_of(m, f.value, params, met, d) and all(_elementwise_of(m, a, params, met, d) for a in e.args)
        if any(q.startswith("torch.") and q.rsplit(".", 1)[-1] in _ELEMENTWISE for q in m.qualified_names(f)):
            return all(_elementwise_of(m, a, params, met, d) for a in e.args)
    return False


def _fed_by_the_model(m: SemanticModel, use: ast.Call) -> bool:
    """An argument of the loss call is the wrapped model's output (the call itself, or a
    name bound to it in the same function): a total over the batch's samples."""
    from dp2ddp.model.collectives import is_wrapped_forward

    for a in use.args:
        if isinstance(a, ast.Call) and is_wrapped_forward(m, a, dp=True):
            return True
        if isinstance(a, ast.Name):
            _, bindings = m.lookup(a.id, m.scope_of(a))
            if bindings and all(isinstance(v, ast.Call) and is_wrapped_forward(m, v, dp=True)
                                for v in map(lambda b: _bound_value(m, b), bindings)):
                return True
    return False


def _bound_value(m: SemanticModel, binding) -> Optional[ast.AST]:
    """What a binding assigns: its value, or for one name of an unpacked tuple
    (``recon, mu, logvar = model(x)``) the whole value unpacked."""
    if binding.kind == "assign":
        return binding.value
    if binding.kind == "unpack":
        parent = m.parent(binding.node)
        if isinstance(parent, ast.Assign) and binding.node in parent.targets:
            return parent.value
    return None


def summed_losses(m: SemanticModel) -> List[SumLoss]:
    """Every use in training of a ``torch.nn`` loss that sums over the samples it sees: a
    loss class (followed to the calls of the name it is bound to) or a functional loss;
    not the ones divided by their batch's size (means), computed under ``torch.no_grad()``
    or in code that reaches no backward, read only as a number (``.item()``), passed
    through a function of this module that multiplies by the world size (already scaled),
    or reaching only a backward whose loop steps no optimizer of model parameters (an
    attack's input gradient: each sample's gradient is the same whoever sums it)."""
    got = m.cache.get("losses:summed")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[SumLoss] = []
    reached = _backward_terms(m)
    for made, arg, functional in _made_sums(m):
        every = [made] if functional else class_uses(m, made)
        if isinstance(arg, ast.ClassDef):
            every = [u for u in every if _fed_by_the_model(m, u)]
            if not every:
                continue  # a total of something else than the model's output: not followed
        uses = [u for u in every if not _divided_by_batch(m, u)]
        if every and not uses:
            continue  # every use a mean
        if not uses:  # a loss made and not seen used: it may train anywhere
            out.append(SumLoss(arg, made, made, False, "dp2ddp sees no call of it to follow to a backward"))
            continue
        other = None if functional else shared_binding(m, made)
        mean = not_a_total(m, arg) if isinstance(arg, ast.ClassDef) else None
        for use in uses:
            if under_no_grad(m, use) or not trains_here(m, use) or _read_as_number(m, use) or _scaled(m, use):
                continue
            if mean is not None:
                where = m.cache.get("losses:class-files", {}).get(id(arg))
                out.append(SumLoss(arg, made, use, False, f"on another path it returns "
                                   f"`{' '.join((where[0] if where else m).source(mean).split())[:60]}` "
                                   f"({where[1] + ' ' if where else ''}line {mean.lineno}), which is no total"))
                continue
            if other is not None:
                out.append(SumLoss(arg, made, use, False, f"the same call also computes the loss bound at line "
                                   f"{other.lineno} (`{' '.join(m.source(other).split())[:60]}`), which may not be a sum"))
                continue
            verdict = reached.get(id(use))
            if verdict is None:
                if _input_gradient_only(m, use):
                    continue
                out.append(SumLoss(arg, made, use, False, "dp2ddp cannot follow it to a backward"))
            elif verdict[0] in ("frozen", "mean"):
                continue
            else:
                out.append(SumLoss(arg, made, use, verdict[0] == "sum", verdict[1]))
    m.cache["losses:summed"] = out
    return out


def _backward_terms(m: SemanticModel) -> Dict[int, Tuple[str, str]]:
    """id(summed loss call) -> ("sum", "") where every backward reaching it differentiates
    only summed losses, ("mixed", the other term) where one adds something else, or
    ("frozen", "") where it reaches only backward passes that train no model parameter."""
    from dp2ddp.model.steps import backward_calls, differentiated

    summed = set()
    for made, _, functional in _made_sums(m):
        summed.update(id(u) for u in ([made] if functional else class_uses(m, made)))
    out: Dict[int, Tuple[str, str]] = {}
    for call in backward_calls(m):
        operand = differentiated(m, call)
        if operand is None:
            continue
        leaves: List[ast.AST] = []
        means: Set[int] = set()
        _terms(m, operand, leaves, set(), 0, means)
        for x in means & summed:
            out.setdefault(x, ("mean", ""))
        ours = [x for x in leaves if id(x) in summed]
        if not ours:
            continue
        if not trains_parameters(m, call):
            for x in ours:
                out.setdefault(id(x), ("frozen", ""))
            continue
        others = [x for x in leaves if id(x) not in summed]
        verdict = ("sum", "") if not others else (
            "mixed", f"the loss differentiated at line {call.lineno} also adds `{' '.join(m.source(others[0]).split())[:60]}` "
            f"(line {others[0].lineno}), which dp2ddp cannot show is a sum over the samples")
        for x in ours:
            if out.get(id(x), ("sum", ""))[0] in ("sum", "frozen"):
                out[id(x)] = verdict
    return out


_SAME_VALUE = frozenset({"to", "cuda", "cpu", "float", "double", "half"})


def _terms(m: SemanticModel, e: ast.AST, out: List[ast.AST], seen: Set[int], depth: int,
           means: Optional[Set[int]] = None, divisions: Optional[List["Division"]] = None) -> None:
    """The terms a loss expression adds up (through ``+``/``-``, factors the same on every
    rank, ``.to(device)``, local names' assignments — the one just before where a name
    updates itself, ``loss = loss / x.size(0)`` — and the returns of this module's
    functions); anything else is a term of its own. A term divided by its batch's size, or
    by a count of its batch (:func:`dp2ddp.model.batch_counts.data_count`: the migration makes
    it every rank's, DDP169), is a mean: the terms inside it go to ``means``, and the division
    to ``divisions`` (``loss /= n`` too, where that is the name's last store)."""
    if depth > 8 or id(e) in seen:
        out.append(e)
        return
    seen.add(id(e))
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Div) and _normaliser(m, e.right):
        inner: List[ast.AST] = []
        _terms(m, e.left, inner, seen, depth + 1, means)
        if means is not None:
            means.update(id(x) for x in inner)
        if divisions is not None:
            divisions.append(Division(e, e.right, inner))
        out.append(e)
    elif (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in _SAME_VALUE
          and m.resolve_call(e) is None):
        _terms(m, e.func.value, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        _terms(m, e.left, out, seen, depth + 1, means, divisions)
        _terms(m, e.right, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult) and _rank_constant(m, e.left):
        _terms(m, e.right, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Mult, ast.Div)) and _rank_constant(m, e.right):
        _terms(m, e.left, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        _terms(m, e.operand, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.Name):
        _, bindings = m.lookup(e.id, m.scope_of(e))
        before = [b for b in bindings if _line(b) < getattr(e, "lineno", 0)
                  and m.enclosing_function(b.node) is m.enclosing_function(e)]
        last = max(before, key=_line, default=None)
        if (last is not None and last.kind == "assign" and last.value is not None
                and any(isinstance(n, ast.Name) and n.id == e.id for n in ast.walk(last.value))):
            _terms(m, last.value, out, seen, depth + 1, means, divisions)  # ``loss = loss / n``: what it was, updated
            return
        if (last is not None and last.kind == "augassign" and isinstance(last.node.op, ast.Div)
                and _normaliser(m, last.node.value) and isinstance(last.node.target, ast.Name)):
            inner: List[ast.AST] = []  # ``loss /= n``: what the name held just before, divided
            prev = max((b for b in before if _line(b) < last.node.lineno), key=_line, default=None)
            if prev is not None and prev.kind == "assign" and prev.value is not None:
                _terms(m, prev.value, inner, seen, depth + 1, means, divisions)
            else:
                inner.append(last.node.target)
            if means is not None:
                means.update(id(x) for x in inner)
            if divisions is not None:
                divisions.append(Division(last.node, last.node.value, inner))
            out.append(e)
            return
        if not bindings or any(b.kind not in ("assign", "augassign") for b in bindings):
            out.append(e)
            return
        for b in bindings:
            value = b.value if b.kind == "assign" else getattr(b.node, "value", None)
            if value is None or (b.kind == "augassign" and not isinstance(b.node.op, (ast.Add, ast.Sub))):
                out.append(e)
                return
            if isinstance(value, ast.Constant) and value.value == 0:
                continue  # ``loss = 0`` before ``loss += ...``
            _terms(m, value, out, seen, depth + 1, means, divisions)
    elif isinstance(e, ast.Call) and m.resolve_call(e) is not None and not summing_keyword(e):
        from dp2ddp.model.steps import own_nodes

        func = m.resolve_call(e)
        returns = [n.value for n in own_nodes(m, func) if isinstance(n, ast.Return) and n.value is not None
                   and m.enclosing_function(n) is func]
        if not returns:
            out.append(e)
        for r in returns:
            _terms(m, r, out, seen, depth + 1, means, divisions)
    else:
        out.append(e)


class Division(NamedTuple):
    """A term of a loss divided by its batch's size or by a count of its batch."""

    node: ast.AST  # ``loss / n`` (a BinOp), or the ``loss /= n`` statement
    divisor: ast.AST
    inner: List[ast.AST]  # the terms of what is divided


def loss_divisions(m: SemanticModel, operand: ast.AST) -> List[Division]:
    """The terms of the loss expression ``operand`` that divide by their batch's size or by a
    count of it (:func:`_terms`), with the terms they divide."""
    out: List[Division] = []
    _terms(m, operand, [], set(), 0, None, out)
    return out


def _normaliser(m: SemanticModel, e: ast.AST) -> bool:
    return batch_size_of(m, e) or data_count(m, e) is not None




def _line(binding) -> int:
    """The line of a binding (``with amp.scale_loss(loss, opt) as scaled_loss``: a
    ``withitem`` has none of its own; its target has)."""
    for node in (binding.node, getattr(binding, "target", None)):
        line = getattr(node, "lineno", None)
        if line is not None:
            return line
    return 0


def _rank_constant(m: SemanticModel, e: ast.AST) -> bool:
    """A factor the same on every rank: numbers, and arithmetic over names and attributes
    that no call in the same function computes (``self.T ** 2``, ``args.alpha``)."""
    func = m.enclosing_function(e)
    for n in ast.walk(e):
        if isinstance(n, ast.Call):
            return False
        if isinstance(n, ast.Name) and func is not None:
            _, bindings = m.lookup(n.id, m.scope_of(n))
            if any(b.kind in ("assign", "augassign") and m.enclosing_function(b.node) is func
                   and not (b.value is not None and isinstance(b.value, ast.Constant)) for b in bindings):
                return False
    return True


def trains_parameters(m: SemanticModel, call: ast.Call) -> bool:
    """A backward whose loop steps an optimizer of model parameters (not only optimizers
    over a list of plain tensors: an attack's perturbation)."""
    from dp2ddp.model.steps import binding_values, innermost_loop, optimizer_steps

    loop = innermost_loop(m, call)
    steps = optimizer_steps(m, loop) if loop is not None else []
    if not steps:
        return True
    for step in steps:
        receiver = step.args[0] if step.args else step.func.value
        values = binding_values(m, receiver) or []
        if not values or not all(_over_plain_tensors(v) for v in values):
            return True
    return False


def _over_plain_tensors(value: ast.AST) -> bool:
    if not (isinstance(value, ast.Call) and value.args and isinstance(value.args[0], (ast.List, ast.Tuple))):
        return False
    return all(isinstance(x, ast.Name) for x in value.args[0].elts)


def _read_as_number(m: SemanticModel, use: ast.Call) -> bool:
    parent = m.parent(use)
    return isinstance(parent, ast.Attribute) and parent.attr in ("item", "detach", "data", "tolist")


def _scaled(m: SemanticModel, use: ast.Call) -> bool:
    """Passed straight to a function of this module that multiplies by the world size
    (the migration's ``whole_sum``)."""
    from dp2ddp.model.names import GET_WORLD_SIZE

    parent = m.parent(use)
    if not (isinstance(parent, ast.Call) and use in parent.args):
        return False
    func = m.resolve_call(parent)
    return func is not None and any(m.call_is(n, GET_WORLD_SIZE) for n in ast.walk(func))


def _input_gradient_only(m: SemanticModel, use: ast.Call) -> bool:
    """A summed loss bound to a name that is read only by ``torch.autograd.grad``: the
    gradient of an input (an attack's), each sample's its own whoever sums it."""
    node, parent = use, m.parent(use)
    while isinstance(parent, (ast.BinOp, ast.UnaryOp)):
        node, parent = parent, m.parent(parent)
    if isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name):
        name = parent.targets[0].id
    elif isinstance(parent, ast.AugAssign) and isinstance(parent.target, ast.Name):
        name = parent.target.id
    else:
        return False
    func = m.enclosing_function(use) or m.tree
    reads = [n for n in ast.walk(func) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)]
    for n in reads:
        node = m.parent(n)
        while node is not None and not isinstance(node, ast.stmt) and not (
                isinstance(node, ast.Call) and m.is_name(node.func, {"torch.autograd.grad"})):
            node = m.parent(node)
        if not isinstance(node, ast.Call):
            return False
    return bool(reads)


def _divided_by_batch(m: SemanticModel, node: ast.AST) -> bool:
    """``node / x.size(0)``, ``node * T ** 2 / len(x)``, ``(1.0 / batch_size) * node`` with
    ``batch_size = len(x)``: a sum made a mean over its batch."""
    while True:
        parent = m.parent(node)
        if not isinstance(parent, ast.BinOp):
            return False
        if isinstance(parent.op, ast.Div) and parent.left is node:
            if batch_size_of(m, parent.right):
                return True
        elif isinstance(parent.op, ast.Mult):
            other = parent.right if parent.left is node else parent.left
            if isinstance(other, ast.BinOp) and isinstance(other.op, ast.Div) and batch_size_of(m, other.right):
                return True
        else:
            return False
        node = parent


def batch_size_of(m: SemanticModel, e: ast.AST) -> bool:
    """``e`` is the size of a batch where it is computed (``x.size(0)``, ``len(x)``, a name
    bound once to one, or to the first of ``x.size()``'s unpacked; products of them)."""
    todo = [e]
    while todo:
        e = todo.pop()
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
            todo += [e.left, e.right]
        elif first_dim_of(e) is not None:
            return True
        elif isinstance(e, ast.Name):
            _, bindings = m.lookup(e.id, m.scope_of(e))
            if len(bindings) == 1 and bindings[0].kind == "assign" and bindings[0].value is not None:
                if first_dim_of(bindings[0].value) is not None:
                    return True
            if len(bindings) == 1 and bindings[0].kind == "unpack" and _first_of_shape(m, bindings[0]):
                return True
    return False


def _first_of_shape(m: SemanticModel, binding) -> bool:
    """``n`` of ``n, c, h, w = x.size()`` (or ``= x.shape``): the batch's size."""
    tup = binding.node
    stmt = m.parent(tup)
    if not (isinstance(tup, (ast.Tuple, ast.List)) and tup.elts and tup.elts[0] is binding.target
            and isinstance(stmt, ast.Assign) and stmt.targets == [tup]):
        return False
    v = stmt.value
    return ((isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "size" and not v.args
             and not v.keywords) or (isinstance(v, ast.Attribute) and v.attr == "shape"))
