"""Evaluation loops whose results are sums: what ``rewrite --shard-eval`` may split by batch.

An *evaluation loop* is a ``for`` over an evaluation DataLoader the script makes (one that
:mod:`dp2ddp.model.loaders` calls evaluation and the migration otherwise leaves whole on
every rank, DDP108), directly or through ``enumerate``/``tqdm``, in the function that made
it or in one it is passed to (:mod:`dp2ddp.model.flow`). Such a loop can be shared out by
whole batches when everything it leaves behind is a sum the original added up:

* its *accumulators*: names bound to a number (``0``, ``0.0``) or a zero tensor before the
  loop, changed in it only by ``+=`` (on a zero tensor, also ``+=`` into one of its
  elements: ``total_metrics[i] += ...``), and read only after it (``correct += (pred ==
  y).sum().item()``, ``test_loss += loss.item()``, ``total += y.size(0)``); and names bound
  to an empty list before the loop, changed in it only by ``.append(...)``/``.extend(...)``
  statements, and read only after it (``preds.append(out.argmax(1).cpu())``: each batch's
  items are kept with their batch and put back in the original's order after the loop);
* ``enumerate``'s index, when it is read after the loop (``test_loss / (batch_idx + 1)``):
  its value there is the original's last index, whatever the rank evaluated;
* nothing else escapes an iteration: no other list appended, nothing changed in place, no
  metric object's ``update()``, no print, log or file written, no ``.backward()``, no
  ``return``/``break``, no value set in the loop read after it, no call of a function
  whose effects the model does not follow (the script's own functions are read, with the
  same rules);
* it runs with gradients off (``torch.no_grad()``/``inference_mode()``, or a function
  decorated with them): a DDP forward with gradients on syncs buffers on every batch,
  which needs the same number of batches on every rank;
* it runs on every rank the same number of times: every ``if`` (and ``while``) around it
  and around the calls that reach it, and every early ``return`` before it, tests a value
  that is the same on every rank (:func:`same_on_every_rank`: constants, the script's
  options, epoch and step counters).

:func:`eval_loops` gives each evaluation loop with its accumulators, or the reason it
stays whole (``problem``, at ``problem_node``); what escapes an iteration is
:mod:`dp2ddp.model.iteration_effects`'s, what is the same on every rank :mod:`dp2ddp.model.rank_alike`'s,
what the loop's names hold across its iterations and after it :mod:`dp2ddp.model.loop_state`'s.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.iteration_effects import GRADIENTS, MAX_DEPTH, escape, walk_statements
from dp2ddp.model.loaders import Loader
from dp2ddp.model.loop_state import (LaterReads, carried_read, collecting_calls, empty_list, loop_stores, start_problem,
                                     zero_tensor)
from dp2ddp.model.rank_alike import same_on_every_rank
from dp2ddp.model.ranks import ends_flow
from dp2ddp.model.syntax import FUNCTIONS, terminal
from dp2ddp.model.training import is_backward, under_no_grad
from dp2ddp.model.training_feeds import iterated


@dataclass
class EvalLoop:
    loop: ast.For
    loaders: List[Loader]
    iterable: ast.AST  # the expression of the loop's header that is the loader
    accumulators: List[str] = field(default_factory=list)
    lists: List[str] = field(default_factory=list)  # the accumulators that are lists it collects into
    index: Optional[str] = None  # enumerate's index, read after the loop
    cap: Optional[ast.If] = None  # `if batch_idx >= n: break` first in the loop (a script that only evaluates)
    problem: Optional[str] = None  # why the loop stays whole on every rank
    problem_node: Optional[ast.AST] = None


def eval_loops(m: SemanticModel, evaluation: Sequence[Loader], made_elsewhere: bool = False) -> List[EvalLoop]:
    """Every ``for`` over one of the ``evaluation`` loaders, each with what it sums or why it
    stays whole. With ``made_elsewhere`` (a script that only evaluates) also every ``for``
    that runs the DataParallel model on what a call dp2ddp cannot read returns
    (``_, test_loader = data.get_loaders(args)``, a project's DataLoader subclass): its
    pass is shared out at run time where the value is a DataLoader whose order is fixed,
    and whole on every rank otherwise (:data:`EvalLoop.loaders` is empty)."""
    from dp2ddp.model.flow import origins

    calls = {id(ld.call): ld for ld in evaluation}
    out: List[EvalLoop] = []
    for loop in m.nodes(ast.For):
        values = list(iterated(loop.iter))  # type: ignore[attr-defined]
        found = [(v, [calls[id(n)] for n, path in origins(m, v) if id(n) in calls and not path]) for v in values]
        hits = [(v, lds) for v, lds in found if lds]
        if not hits:
            header = _made_elsewhere(m, loop, len(values)) if made_elsewhere else None
            if header is not None:
                got = EvalLoop(loop, [], header)
                _judge(m, got, len(values), capped=made_elsewhere)
                out.append(got)
            continue
        value, lds = hits[0]
        got = EvalLoop(loop, list({id(ld.call): ld for ld in lds}.values()), value)  # type: ignore[arg-type]
        _judge(m, got, len(values), capped=made_elsewhere)
        out.append(got)
    return out


def _judge(m: SemanticModel, e: EvalLoop, n_values: int, capped: bool = False) -> None:
    """With ``capped`` (a script that only evaluates: its wrap syncs no buffers in the
    forward, so a rank may evaluate no batch) a loop may stop at a batch number (:func:`_cap`)."""
    loop = e.loop

    def stays(why: str, node: Optional[ast.AST] = None) -> None:
        e.problem, e.problem_node = why, node or loop

    header, index = _header(m, loop)
    if n_values > 1:
        return stays(f"it iterates several values together (`{m.brief(loop.iter)}`)")
    if header is not e.iterable:
        return stays(f"it iterates the loader through `{m.brief(loop.iter)}`, which dp2ddp does not pass through")
    from dp2ddp.model.flow import origins

    others = [n for n, path in origins(m, e.iterable) if e.loaders and (path or not any(n is ld.call for ld in e.loaders)
              and not (isinstance(n, ast.Constant) and n.value is None))]
    if others:
        return stays(f"`{m.source(e.iterable)}` may also be `{m.brief(others[0])}` (line {others[0].lineno})", others[0])
    if loop.orelse:
        return stays("it has an `else:` block", loop.orelse[0])
    grad = _gradients(m, loop)
    if grad is not None:
        return stays(f"it computes gradients (`{m.brief(grad)}`, line {grad.lineno}): an evaluation under attack "
                     "runs the DDP forward with gradients on", grad)
    if not _grad_free(m, loop):
        return stays("it runs with gradients on (put it under `torch.no_grad()`): a DDP forward with gradients on "
                     "syncs buffers on every batch, which needs the same number of batches on every rank")
    scope = m.scope_of(loop)
    stored, plain = loop_stores(m, loop, scope)
    accs: List[str] = []
    collected = collecting_calls(m, loop, scope, stored)
    items: List[ast.AugAssign] = []  # `total_metrics[i] += ...`: a sum into an element of a zero tensor
    for node in walk_statements(loop.body):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id not in plain:
            name = node.target.id
            if not isinstance(node.op, ast.Add):
                return stays(f"it changes `{name}` with `{_op(node)}=` (line {node.lineno}), not a sum", node)
            if name not in accs:
                accs.append(name)
        elif (isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) and isinstance(node.target, ast.Subscript)
              and isinstance(node.target.value, ast.Name) and node.target.value.id not in stored
              and m.scope_of(node) is scope and m.lookup(node.target.value.id, scope)[0] is scope):
            items.append(node)
            if node.target.value.id not in accs:
                accs.append(node.target.value.id)
    local = stored - set(accs)
    for name in sorted(stored & (scope.globals | scope.nonlocals)):
        return stays(f"it sets `{name}`, declared global in its function", loop)
    lists = list(dict.fromkeys(c.func.value.id for c in collected))  # type: ignore[attr-defined]  # in source order
    body = loop.body
    e.cap = _cap(m, loop, index, stored) if capped else None
    if e.cap is not None:
        body = body[1:]  # the cap's break stops every rank where the original stopped (see _cap)
    why = escape(m, body, local, set(accs) | set(lists), scope, loop, 0,
                 frozenset(id(c) for c in collected) | frozenset(id(a) for a in items))
    if why is not None:
        return stays(f"it {why[1]}", why[0])
    carried = carried_read(m, loop, local, scope)
    if carried is not None:
        return stays(f"it carries `{carried.id}` from one batch to the next (line {carried.lineno}): each rank would "
                     "see another batch's value there", carried)
    for name in accs:
        tensor = any(a.target.value.id == name for a in items)  # type: ignore[attr-defined]
        why = start_problem(m, loop, name, scope, zero_tensor if tensor else None)
        if why is not None:
            return stays(why[1].replace("a number or a zero tensor", "a zero tensor") if tensor else why[1], why[0])
    for name in lists:
        why = start_problem(m, loop, name, scope, empty_list)
        if why is not None:
            return stays(why[1].replace("a number or a zero tensor", "an empty list"), why[0])
    reads = LaterReads(m, scope, loop)
    for name in sorted(local):
        r = reads.after(name)
        if r is None:
            continue
        if name == index:
            if e.cap is not None:
                return stays(f"`{name}`, the batch number its `break` (line {e.cap.lineno}) tests, is read after it "
                             f"(line {r.lineno}): where it stopped differs by rank", r)
            e.index = index
            continue
        return stays(f"`{name}`, set in the loop, is read after it (line {r.lineno}): its last value differs by rank", r)
    cond = _unproven_condition(m, loop, 0)
    if cond is not None:
        node, why = cond
        return stays(why, node)
    e.accumulators = accs + lists
    e.lists = lists


def _cap(m: SemanticModel, loop: ast.For, index: Optional[str], stored: Set[str]) -> Optional[ast.If]:
    """``if batch_idx >= n: break`` as the first statement of ``for batch_idx, b in
    enumerate(loader):`` (hendrycks' OOD tests: ``if batch_idx >= ood_num_examples //
    args.test_bs and in_dist is False: break``): the original evaluates exactly the batches
    numbered below the first one the test holds for. The test must only grow true with the
    number (``>=``/``>`` on the index, ``and``-ed with terms that do not change in the loop)
    and be the same on every rank; then each rank, numbering its batches as the original did
    (``EvalPass.numbered``), stops at its first batch at or past that one and has evaluated
    its share of exactly the original's batches. The index is bound by the header only."""
    first = loop.body[0] if loop.body else None
    if index is None or not (isinstance(first, ast.If) and not first.orelse and len(first.body) == 1
                             and isinstance(first.body[0], ast.Break)):
        return None
    if not (isinstance(loop.iter, ast.Call) and terminal(loop.iter.func) == "enumerate" and loop.iter.args
            and not isinstance(loop.iter.args[0], ast.Call) and len(loop.iter.args) + len(loop.iter.keywords) <= 2):
        return None  # enumerate(loader[, start]) directly (not through tqdm: the pass replaces the whole header)
    for n in walk_statements(loop.body):
        if isinstance(n, ast.Name) and n.id == index and isinstance(n.ctx, (ast.Store, ast.Del)):
            return None
    test = first.test
    terms = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    bounds = [(t, _index_bound(t, index)) for t in terms]
    if sum(b is not None for _, b in bounds) != 1:
        return None
    for t, bound in bounds:
        fixed = bound if bound is not None else t  # the bound's other side, or a term that is not the bound
        names = {n.id for n in ast.walk(fixed) if isinstance(n, ast.Name)}
        if names & stored or not same_on_every_rank(m, fixed):
            return None
    return first


def _index_bound(t: ast.AST, index: str) -> Optional[ast.AST]:
    """``n`` of ``index >= n``, ``index > n``, ``n <= index``, ``n < index``; else None."""
    if not (isinstance(t, ast.Compare) and len(t.ops) == 1):
        return None
    left, op, right = t.left, t.ops[0], t.comparators[0]
    if isinstance(left, ast.Name) and left.id == index and isinstance(op, (ast.GtE, ast.Gt)):
        return right
    if isinstance(right, ast.Name) and right.id == index and isinstance(op, (ast.LtE, ast.Lt)):
        return left
    return None


# calls whose value is not a loader of data
_NOT_LOADERS = frozenset({"builtins.range", "builtins.zip", "builtins.enumerate", "builtins.list", "builtins.tuple",
                          "builtins.sorted", "builtins.reversed", "builtins.dict", "builtins.set", "builtins.map",
                          "builtins.filter", "builtins.open", "builtins.iter", "builtins.len"})


def _made_elsewhere(m: SemanticModel, loop: ast.For, n_values: int) -> Optional[ast.AST]:
    """The header expression of ``loop`` (through ``enumerate``/``tqdm``) when the loop runs
    the DataParallel model and iterates, on every path, what a call dp2ddp does not read
    returns (a function or class of the project, ``getattr(module, name)(...)``); else None."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.uses import dp_wrapper_uses

    if n_values != 1:
        return None
    header, _ = _header(m, loop)
    if not isinstance(header, (ast.Name, ast.Attribute)):
        return None
    if not any(u.kind == "forward" and m.contains(loop, u.node) for u in dp_wrapper_uses(m)):
        return None
    got = origins(m, header)
    if not got:
        return None
    for node, _path in got:
        if not isinstance(node, ast.Call):
            return None
        q = m.qualified_names(node.func)
        if q & _NOT_LOADERS or any(x.startswith(("torch.", "numpy.")) for x in q) or m.resolve_call(node) is not None:
            return None  # a value dp2ddp can read (a function of this script, torch's, a builtin's): not a loader made elsewhere
    return header


def _op(node: ast.AugAssign) -> str:
    return {ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**",
            ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>",
            ast.MatMult: "@"}.get(type(node.op), "?")


def _grad_free(m: SemanticModel, loop: ast.AST, depth: int = 0) -> bool:
    """The loop's forwards of the model run with gradients off: the loop is under
    ``torch.no_grad()`` (or its function is decorated so), every forward of the wrapped
    model in it is (``for x, y in loader: with torch.no_grad(): out = model(x)``), or every
    call of its function is (``with torch.no_grad(): validate(model, loader)``)."""
    from dp2ddp.model.collectives import is_wrapped_forward

    if under_no_grad(m, loop):
        return True
    forwards = [c for c in m.calls_in(loop) if is_wrapped_forward(m, c, dp=True)]
    if forwards and all(under_no_grad(m, c) for c in forwards):
        return True
    func = m.enclosing_function(loop)
    sites = list(m.call_sites(func)) if func is not None and depth < 2 else []
    return bool(sites) and all(_grad_free(m, c, depth + 1) for c in sites)


def _header(m: SemanticModel, loop: ast.For) -> Tuple[ast.AST, Optional[str]]:
    """The expression a loop's header iterates through ``enumerate``/``tqdm``, and
    ``enumerate``'s index name."""
    it, index = loop.iter, None
    if isinstance(it, ast.Call) and terminal(it.func) == "enumerate" and it.args:
        t = loop.target
        if isinstance(t, (ast.Tuple, ast.List)) and t.elts and isinstance(t.elts[0], ast.Name):
            index = t.elts[0].id
        it = it.args[0]
    if isinstance(it, ast.Call) and terminal(it.func) == "tqdm" and it.args:
        it = it.args[0]
    return it, index


def _gradients(m: SemanticModel, loop: ast.For) -> Optional[ast.Call]:
    """A ``.backward()`` or ``torch.autograd.grad`` the loop reaches (through the script's
    functions too)."""
    for call in m.reached_calls(loop):
        if is_backward(call) or m.qualified_names(call.func) & GRADIENTS:
            return call
    return None


def _unproven_condition(m: SemanticModel, node: ast.AST, depth: int) -> Optional[Tuple[ast.AST, str]]:
    """An ``if``/``while`` around ``node`` (or an early ``return`` before it), in its
    function or around the calls that reach it, whose test may differ between ranks."""
    child = node
    for a in m.ancestors(node):
        if isinstance(a, FUNCTIONS + (ast.Lambda, ast.ClassDef)):
            break
        if isinstance(a, (ast.If, ast.IfExp, ast.While)) and child is not a.test and not same_on_every_rank(m, a.test):
            return a.test, f"it runs under `{m.brief(a.test)}` (line {a.lineno}), which may differ between ranks"
        child = a
    cur: Optional[ast.AST] = m.statement_of(node)
    while cur is not None and not isinstance(cur, FUNCTIONS + (ast.Module, ast.ClassDef)):
        for sib in m.siblings_before(cur):  # type: ignore[arg-type]
            if isinstance(sib, ast.If) and ends_flow(sib) and not same_on_every_rank(m, sib.test):
                return sib.test, f"`{m.brief(sib.test)}` (line {sib.lineno}) may end its function early on some ranks only"
        cur = m.parent(cur)
        while cur is not None and not isinstance(cur, ast.stmt):
            cur = m.parent(cur)
    func = m.enclosing_function(node)
    if func is None:
        return None
    name = func.name  # type: ignore[attr-defined]
    sites = m.call_sites(func)
    if not sites:
        return func, f"`{name}` is not called from this script, so dp2ddp cannot tell that every rank runs it"
    if depth >= MAX_DEPTH:
        return func, f"`{name}` is called too deep for dp2ddp to tell that every rank runs it"
    for s in sites:
        got = _unproven_condition(m, s, depth + 1)
        if got is not None:
            return got
    return None
