"""Training steps: backward passes and optimizer steps.

A *training loop* runs ``loss.backward()`` on each pass (:func:`backward_calls`); an
*optimizer step* (``optimizer.step()``, ``scaler.step(optimizer)``) follows it
(:func:`optimizer_steps`; an optimizer is told from a scheduler by the constructor its
receiver is bound to, :func:`receiver_kind`). Loops whose step runs only on some passes
are :mod:`dp2ddp.model.accumulation`'s.
"""
from __future__ import annotations

import ast
from typing import List, Optional, Set, Tuple

from dp2ddp.model.collectives import var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import AUTOGRAD_BACKWARD, GRAD_CLIPS, OPTIMIZERS, SCHEDULER_FACTORIES, SCHEDULER_MODULES
from dp2ddp.model.syntax import FUNCTIONS, children, kwarg

_NESTED = FUNCTIONS + (ast.ClassDef, ast.Lambda)


def own_nodes(m: SemanticModel, root: ast.AST) -> List[ast.AST]:
    """The nodes of ``root`` (a loop or a statement), not entering nested functions,
    classes or lambdas, in source order."""
    out = []
    todo = [root]
    while todo:
        n = todo.pop()
        out.append(n)
        for c in children(n):
            if not isinstance(c, _NESTED):
                todo.append(c)
    return sorted((n for n in out if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset))


def names_bound(m: SemanticModel, root: ast.AST) -> Set[str]:
    """Names ``root`` (a loop: its target and the assignments among its own statements)
    binds, not entering nested functions, classes or lambdas."""
    return {n.id for n in own_nodes(m, root) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def innermost_loop(m: SemanticModel, node: ast.AST) -> Optional[ast.AST]:
    loops = m.enclosing_loops(node)
    return loops[0] if loops else None


def is_backward(m: SemanticModel, call: ast.Call) -> bool:
    """``loss.backward()``, ``scaler.scale(loss).backward()``, ``torch.autograd.backward(loss)``."""
    f = call.func
    if m.is_name(f, AUTOGRAD_BACKWARD):
        return True
    if not (isinstance(f, ast.Attribute) and f.attr == "backward"):
        return False
    root = f.value
    while isinstance(root, ast.Attribute):
        root = root.value
    if isinstance(root, ast.Name):  # not a module's function (`torch.autograd.backward` is above)
        _, bindings = m.lookup(root.id, m.scope_of(root))
        return not any(b.kind == "import" for b in bindings)
    return True


def backward_calls(m: SemanticModel) -> List[ast.Call]:
    got = m.cache.get("steps:backward")
    if got is None:
        got = m.cache["steps:backward"] = [c for c in m.nodes(ast.Call) if is_backward(m, c)]
    return got  # type: ignore[return-value]


def differentiated(m: SemanticModel, call: ast.Call) -> Optional[ast.AST]:
    """The loss a backward call differentiates: ``x`` of ``x.backward()``,
    ``scaler.scale(x).backward()``, ``torch.autograd.backward(x)``."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "backward":
        recv = f.value
        if (isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute) and recv.func.attr == "scale"
                and len(recv.args) == 1 and not recv.keywords):
            return recv.args[0]
        return recv
    tensors = kwarg(call, "tensors")  # torch.autograd.backward(tensors, grad_tensors, ...)
    return call.args[0] if call.args else tensors.value if tensors is not None else None


# ----------------------------------------------------------------------- optimizer steps


def binding_values(m: SemanticModel, node: ast.AST) -> Optional[List[ast.AST]]:
    """The values every binding of the variable ``node`` names assigns (None: not all are
    plain assignments, or the variable is not followed)."""
    if isinstance(node, ast.Name):
        _, bindings = m.lookup(node.id, m.scope_of(node))
        if not bindings or any(b.kind != "assign" or b.value is None for b in bindings):
            return None
        return [b.value for b in bindings]
    key = var_key(m, node)
    if key is None or key[0] != "attr":
        return None
    values = [
        a.value
        for a in m.nodes(ast.Assign)
        if len(a.targets) == 1 and isinstance(a.targets[0], ast.Attribute) and var_key(m, a.targets[0]) == key
    ]
    return values or None


def kind_of_value(m: SemanticModel, value: ast.AST) -> Optional[str]:
    """``"optimizer"`` / ``"scheduler"`` for a constructor call that says which, else None."""
    if isinstance(value, ast.IfExp):
        kinds = {kind_of_value(m, value.body), kind_of_value(m, value.orelse)}
        return kinds.pop() if len(kinds) == 1 else None
    if not isinstance(value, ast.Call):
        return None
    for q in m.qualified_names(value.func):
        if q in SCHEDULER_FACTORIES or any(q.startswith(p + ".") for p in SCHEDULER_MODULES):
            return "scheduler"
        if q in OPTIMIZERS or (q.startswith("torch.optim.") and q.count(".") == 2 and q[12:13].isupper()):
            return "optimizer"
    return None


def receiver_kind(m: SemanticModel, receiver: ast.AST) -> Optional[str]:
    """What ``receiver.step()`` steps: ``"optimizer"``, ``"scheduler"`` or None (unknown).
    Known by the constructor it was bound to, or, for an optimizer, by being zeroed
    (``receiver.zero_grad()``) or passed to ``scaler.step(receiver)``."""
    values = binding_values(m, receiver)
    if values:
        kinds = {kind_of_value(m, v) for v in values}
        if len(kinds) == 1 and None not in kinds:
            return kinds.pop()
    key = var_key(m, receiver)
    if key is not None:
        for c in m.nodes(ast.Call):
            f = c.func
            if isinstance(f, ast.Attribute) and f.attr == "zero_grad" and var_key(m, f.value) == key:
                return "optimizer"
            if isinstance(f, ast.Attribute) and f.attr == "step" and len(c.args) == 1 and var_key(m, c.args[0]) == key:
                return "optimizer"
    return None


def optimizer_steps(m: SemanticModel, loop: ast.AST) -> List[ast.Call]:
    """The optimizer steps of ``loop``'s own passes (not of loops nested in it; ``loop`` may
    be a function that steps once a call, SRFBN's ``train_step``): every
    ``x.step(...)`` whose receiver is not known to be a learning-rate scheduler, the
    known optimizers' only where there are some."""
    known, unknown = [], []
    for n in own_nodes(m, loop):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "step"):
            continue
        if innermost_loop(m, n) is not (None if isinstance(loop, FUNCTIONS) else loop):
            continue  # (a function that steps once a call: its steps outside any loop of its own)
        kind = "optimizer" if n.args else receiver_kind(m, n.func.value)  # scaler.step(optimizer)
        if kind == "optimizer":
            known.append(n)
        elif kind is None:
            unknown.append(n)
    return known or unknown


def grad_reads(m: SemanticModel, nodes: List[ast.AST]) -> List[ast.AST]:
    """Nodes among ``nodes`` that read or change the gradients: ``clip_grad_norm_(...)``,
    ``p.grad``, ``scaler.unscale_(...)``."""
    out = []
    for n in nodes:
        if isinstance(n, ast.Call) and (m.is_name(n.func, GRAD_CLIPS) or (isinstance(n.func, ast.Attribute) and n.func.attr == "unscale_")):
            out.append(n)
        elif isinstance(n, ast.Attribute) and n.attr == "grad" and isinstance(n.ctx, ast.Load):
            out.append(n)
    return out


# ----------------------------------------------------------------------- accumulation


AUTOGRAD_GRAD = frozenset({"torch.autograd.grad"})


def second_order(m: SemanticModel) -> List[ast.Call]:
    """Backward passes that build a graph of the parameters' gradients for a second
    derivative: ``loss.backward(create_graph=x)``, and ``torch.autograd.grad(..., inputs,
    create_graph=x)`` whose inputs are parameters (``model.parameters()``, an optimizer's
    ``param_groups``), where ``x`` may be true on some run (a second-order optimizer's
    ``create_graph`` flag, a Hessian-vector product). ``create_graph=False`` (or a local name
    set only to a false constant) is not one, nor a gradient with respect to an input (WGAN-GP's
    penalty, an adversarial perturbation's gradient): DDP's hooks see parameters only."""
    from dp2ddp.model.call_args import AUTOGRAD_BACKWARD_PARAMS, AUTOGRAD_GRAD_PARAMS, TENSOR_BACKWARD_PARAMS, argument

    got = m.cache.get("steps:second_order")
    if got is not None:
        return got  # type: ignore[return-value]
    out = []
    for call in m.nodes(ast.Call):
        grad = m.is_name(call.func, AUTOGRAD_GRAD)
        if grad:
            params = AUTOGRAD_GRAD_PARAMS
        elif m.is_name(call.func, AUTOGRAD_BACKWARD):
            params = AUTOGRAD_BACKWARD_PARAMS
        elif is_backward(m, call):
            params = TENSOR_BACKWARD_PARAMS
        else:
            continue
        if not _builds_graph(m, call, params):
            continue
        if grad and not _of_parameters(m, argument(call, params, "inputs")):
            continue  # a gradient penalty: :func:`input_penalties`
        out.append(call)
    m.cache["steps:second_order"] = out
    return out


def _builds_graph(m: SemanticModel, call: ast.Call, params) -> bool:
    """The backward call's ``create_graph`` may be true on some run (a flag from the caller
    counts; ``create_graph=False``, or a local name set only to a false constant, does not)."""
    from dp2ddp.model.call_args import argument
    from dp2ddp.model.dead_code import constant_truth

    flag = argument(call, params, "create_graph")
    return flag is not None and constant_truth(m, flag) is not False


def input_penalties(m: SemanticModel) -> List[ast.Call]:
    """``torch.autograd.grad(out, x, ..., create_graph=True)`` with respect to an input, not
    the parameters (WGAN-GP's and R1's gradient penalty), whose value is backpropagated on its
    own (``gp.backward()``): that backward reaches only the parameters the input gradient
    depends on (a last layer's bias has none). One added to a loss with a forward of its own
    (``d_loss = D(fake) - D(real) + gp``, one backward) reaches every parameter, and is not one."""
    from dp2ddp.model.call_args import AUTOGRAD_GRAD_PARAMS, argument

    out = []
    for call in m.nodes(ast.Call):
        if not m.is_name(call.func, AUTOGRAD_GRAD) or not _builds_graph(m, call, AUTOGRAD_GRAD_PARAMS):
            continue
        if not _of_parameters(m, argument(call, AUTOGRAD_GRAD_PARAMS, "inputs")) and _backed_alone(m, call):
            out.append(call)
    return out


def _backed_alone(m: SemanticModel, grad: ast.Call) -> bool:
    """A ``.backward()`` in ``grad``'s function runs on a value made from ``grad``'s result
    and from no other call of a model (names followed through the function's assignments in
    source order; what ``grad`` is given does not count)."""
    func = m.enclosing_function(grad) or m.tree
    inside = {id(n) for n in ast.walk(grad)}
    penalty, other = set(), set()  # names holding the penalty's values / values with a forward of their own

    def kinds(expr: ast.AST):
        pen = mod = False
        for n in ast.walk(expr):
            if id(n) in inside:
                pen = pen or n is grad
                continue
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                pen = pen or n.id in penalty
                mod = mod or n.id in other
            elif isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)) and not _tensor_math(n):
                mod = True  # a forward (or anything else that may make a loss term)
        return pen, mod

    # in source order, each assignment replacing what its names held (``d_loss = real + fake``,
    # later ``d_loss = lambda_gp * gp``: the second backward backs the penalty alone)
    events = [n for n in ast.walk(func) if isinstance(n, ast.Assign) or (
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "backward")]
    for node in sorted(events, key=lambda a: (a.lineno, a.col_offset)):
        if isinstance(node, ast.Call):
            pen, mod = kinds(node.func.value)
            if pen and not mod:
                return True
            continue
        pen, mod = kinds(node.value)
        names = {t.id for tgt in node.targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}
        penalty -= names
        other -= names
        if pen and not mod:
            penalty |= names
        elif mod:
            other |= names
    return False


_TENSOR_MATH = frozenset({"norm", "mean", "sum", "pow", "sqrt", "view", "reshape", "flatten", "size", "abs", "square",
                          "relu", "clamp", "clamp_min", "square_", "mul", "add", "sub", "detach", "item", "numel",
                          "ones", "zeros", "cuda", "to", "float", "ones_like", "zeros_like", "rand", "randn"})


def _tensor_math(call: ast.Call) -> bool:
    """A tensor method or torch function that only does arithmetic on what it is given
    (``grad.norm(2, dim=1)``, ``torch.mean(...)``): not a forward."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in _TENSOR_MATH


def _of_parameters(m: SemanticModel, value: Optional[ast.AST]) -> bool:
    """``torch.autograd.grad``'s ``inputs`` are parameters: the expression (or what a name of
    it is bound to) calls ``.parameters()``/``.named_parameters()`` or reads ``param_groups``."""
    if value is None:
        return True  # hidden in *args/**kwargs: not shown to be an input
    exprs = [value] + [v for n in ast.walk(value) if isinstance(n, ast.Name) for v in (binding_values(m, n) or [])]
    for e in exprs:
        for n in ast.walk(e):
            if isinstance(n, ast.Attribute) and n.attr in ("parameters", "named_parameters", "param_groups"):
                return True
    return False



def loss_decided_steps(m: SemanticModel) -> List[Tuple[ast.Call, ast.If, ast.AST, ast.AST]]:
    """Optimizer steps a test of the loss decides: ``if is_valid_number(loss.item()):
    optimizer.step()`` (SiamMask), ``if torch.isfinite(loss): optimizer.step()``. Under DDP
    each rank holds the loss of its own share of the batch, so one rank may step where
    another skips, and the replicas part for good. ``(step, the if, the name the test reads,
    the loss)``: the loss a backward of the same loop differentiates, read in the test by its
    name (or through a name bound from it in the loop: ``value = loss.item()``)."""
    got = m.cache.get("steps:loss-decided")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.Call, ast.If, ast.AST, ast.AST]] = []
    for b in backward_calls(m):
        loss = differentiated(m, b)
        if not isinstance(loss, ast.Name):
            continue
        # the loop of the step: the backward's own, or one around it where the backward
        # accumulates over micro-batches, or the function that makes one step a call (a
        # solver's ``train_step``: the loop that calls it is its caller's; SRFBN's splits
        # its batch, backward per split, then tests the summed loss before its one step)
        loop = next((s for s in [*m.enclosing_loops(b), m.enclosing_function(b)] if s is not None and optimizer_steps(m, s)), None)
        if loop is None:
            continue
        names = {loss.id}
        for n in own_nodes(m, loop):  # names bound from the loss in the loop: ``value = loss.item()``, ``total += ...``
            if isinstance(n, (ast.Assign, ast.AugAssign)) and any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(n.value)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                names |= {t.id for tgt in targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}
        for step in optimizer_steps(m, loop):
            for a in m.ancestors(step):
                if a is loop:
                    break
                if isinstance(a, ast.If) and m.contains(a, step) and not any(m.contains(s, step) for s in a.orelse):
                    read = next((x for x in ast.walk(a.test) if isinstance(x, ast.Name) and x.id in names), None)
                    if read is not None:
                        out.append((step, a, read, loss))
                        break
            if out and out[-1][0] is step:
                break
    m.cache["steps:loss-decided"] = out
    return out


def loss_decided_skips(m: SemanticModel) -> List[Tuple[ast.stmt, ast.If, ast.AST, ast.AST]]:
    """Backward passes skipped on a test of the loss: ``if bool(loss == 0): continue`` (or
    ``torch.isnan(loss)``) before ``loss.backward()`` in the same loop (pytorch-retinanet).
    Under DDP a rank that skips its backward leaves the others waiting in the gradient
    all-reduce (gloo stops, NCCL hangs). ``(the continue or break, the if, the name the test
    reads, the loss)``."""
    got = m.cache.get("steps:loss-decided-skips")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.stmt, ast.If, ast.AST, ast.AST]] = []
    for b in backward_calls(m):
        loop = innermost_loop(m, b)
        loss = differentiated(m, b)
        if loop is None or not isinstance(loss, ast.Name):
            continue
        names = {loss.id}
        nodes = own_nodes(m, loop)
        for n in nodes:  # names bound from the loss before the backward: ``value = loss.item()``
            if (isinstance(n, ast.Assign) and n.lineno < b.lineno
                    and any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(n.value))):
                names |= {t.id for tgt in n.targets for t in ast.walk(tgt) if isinstance(t, ast.Name)}
        for n in nodes:
            if not (isinstance(n, ast.If) and n.lineno < b.lineno and not m.contains(n, b)):
                continue
            read = next((x for x in ast.walk(n.test) if isinstance(x, ast.Name) and x.id in names), None)
            skip = next((x for st in n.body for x in ast.walk(st) if isinstance(x, (ast.Continue, ast.Break))
                         and innermost_loop(m, x) is loop), None)
            if read is not None and skip is not None:
                out.append((skip, n, read, loss))
    m.cache["steps:loss-decided-skips"] = out
    return out

