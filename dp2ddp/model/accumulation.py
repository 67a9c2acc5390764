"""Gradient accumulation: loops whose optimizer step follows only some backward passes.

Where the step runs only on some passes (``if (i + 1) % accum == 0: optimizer.step()``),
the loop *accumulates* gradients: :func:`accumulations` finds each such loop and reads the
step condition as it would be evaluated *before the forward* of the pass, which is where
DDP must know whether this pass's backward all-reduces (``model.no_sync()`` around the
forward and backward of the passes that do not step).

Reading the condition early is exact when nothing it reads changes between the forward
and the test: names bound in between make it unreadable, except a counter incremented by
a constant at the top level of the loop (``step += 1``), which is read as ``step + 1``.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

from dp2ddp.model.collectives import VarKey, reaching_functions, var_key, wrapped_vars
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.steps import backward_calls, grad_reads, innermost_loop, optimizer_steps, own_nodes
from dp2ddp.model.uses import wrapper_keys

# calls a step condition may make: their value depends only on their arguments
PURE_BUILTINS = frozenset(f"builtins.{n}" for n in ("len", "min", "max", "int", "abs", "bool", "float", "round"))


@dataclass
class Accumulation:
    loop: ast.AST
    step: ast.Call  # the first optimizer step after the last backward
    backward: ast.Call  # the last backward pass of the loop's body
    gate: List[Tuple[ast.AST, bool]]  # the tests that decide the step, with their polarity
    first: Optional[ast.stmt] = None  # the loop's statements to run under no_sync: first ..
    last: Optional[ast.stmt] = None  # .. last (both in loop.body)
    condition: Optional[str] = None  # the step condition, as read before the forward
    wrapper: Optional[ast.AST] = None  # the DDP model whose forward the statements run
    problem: Optional[str] = None  # error: the condition cannot be read before the forward
    problem_node: Optional[ast.AST] = None
    keep_sync: Optional[str] = None  # warning: why every backward keeps all-reducing
    keep_sync_node: Optional[ast.AST] = None
    substituted: Dict[str, str] = field(default_factory=dict)


def _block_chain(m: SemanticModel, node: ast.AST, loop: ast.AST) -> List[ast.AST]:
    """The statements holding ``node`` from ``loop``'s body down (outermost first)."""
    chain = []
    for a in m.ancestors(node):
        if a is loop:
            break
        if isinstance(a, ast.stmt):
            chain.append(a)
    return list(reversed(chain)) + ([node] if isinstance(node, ast.stmt) else [])


def _contains_step(m: SemanticModel, stmts: List[ast.stmt], steps: List[ast.Call]) -> bool:
    return any(m.contains(s, st) for s in stmts for st in steps)


def _gate(m: SemanticModel, loop: ast.AST, backward: ast.Call, step: ast.Call, steps: List[ast.Call]) -> List[Tuple[ast.AST, bool]]:
    """The tests between the backward pass and ``step`` that decide whether it runs: the
    ``if`` statements below the innermost block holding both whose other branch does not
    step too, and the ``if <test>: continue`` statements of those blocks after the backward."""
    bchain = _block_chain(m, backward, loop)
    schain = _block_chain(m, step, loop)
    common = 0
    while common < min(len(bchain), len(schain)) and bchain[common] is schain[common]:
        common += 1
    after_backward = (backward.lineno, backward.col_offset)
    out: List[Tuple[ast.AST, bool]] = []
    for depth in range(common, len(schain)):
        stmt = schain[depth]
        block = m.block_of(stmt)
        if block is not None:
            for prev in block[2]:
                if prev is stmt:
                    break
                if (
                    isinstance(prev, ast.If)
                    and len(prev.body) == 1
                    and isinstance(prev.body[0], ast.Continue)
                    and not prev.orelse
                    and (prev.lineno, prev.col_offset) > after_backward
                ):
                    out.append((prev.test, False))
        if isinstance(stmt, ast.If) and depth + 1 < len(schain):
            inner = schain[depth + 1]
            if any(s is inner for s in stmt.body):
                if not _contains_step(m, stmt.orelse, steps):
                    out.append((stmt.test, True))
            elif any(s is inner for s in stmt.orelse):
                if not _contains_step(m, stmt.body, steps):
                    out.append((stmt.test, False))
    return out


def _shaped(m: SemanticModel, loop: ast.AST, tests: List[ast.AST]) -> bool:
    """An accumulation test: it takes a remainder (``% accum``) or reads a counter the loop
    increments."""
    counters = {
        ast.unparse(n.target)
        for n in own_nodes(m, loop)
        if isinstance(n, ast.AugAssign) and isinstance(n.target, (ast.Name, ast.Attribute))
    }
    for t in tests:
        for n in ast.walk(t):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod):
                return True
            if isinstance(n, (ast.Name, ast.Attribute)) and ast.unparse(n) in counters:
                return True
    return False


def _forward_of(m: SemanticModel, stmt: ast.stmt, keys: Set[VarKey]) -> List[Tuple[VarKey, ast.AST]]:
    """The wrapped models whose forward ``stmt`` runs: ``model(x)``, or a function of the
    script that runs it, called with the model (``step(model, batch)``)."""
    reach = reaching_functions(m, dp=True)
    out = []
    for n in own_nodes(m, stmt):
        if not isinstance(n, ast.Call):
            continue
        k = var_key(m, n.func)
        if k is not None and k in keys:
            out.append((k, n.func))
            continue
        t = m.resolve_call(n)
        if t is not None and t in reach and "DDP forward" in reach[t]:
            for a in list(n.args) + [kw.value for kw in n.keywords]:
                ka = var_key(m, a)
                if ka is not None and ka in keys:
                    out.append((ka, a))
    return out


def assignment_targets(node: ast.AST) -> List[ast.AST]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return [node.target]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        return [i.optional_vars for i in node.items if i.optional_vars is not None]
    if isinstance(node, ast.NamedExpr):
        return [node.target]
    if isinstance(node, ast.Delete):
        return list(node.targets)
    return []


def flat_targets(t: ast.AST) -> List[ast.AST]:
    if isinstance(t, (ast.Tuple, ast.List)):
        return [x for e in t.elts for x in flat_targets(e)]
    if isinstance(t, ast.Starred):
        return flat_targets(t.value)
    return [t]


def _read_early(m: SemanticModel, loop: ast.AST, acc: Accumulation, tests: List[Tuple[ast.AST, bool]]) -> Tuple[Optional[str], Optional[str], Optional[ast.AST]]:
    """The condition as evaluated before ``acc.first`` runs, or why it cannot be read."""
    start = (acc.first.lineno, acc.first.col_offset)  # type: ignore[union-attr]
    gate_start = min((t.lineno, t.col_offset) for t, _ in tests)
    read: Set[str] = set()
    for t, _ in tests:
        for n in ast.walk(t):
            if isinstance(n, ast.NamedExpr):
                return None, "it assigns a name (`:=`)", n
            if isinstance(n, ast.Call) and not (m.qualified_names(n.func) & PURE_BUILTINS):
                return None, f"it calls `{ast.unparse(n.func)}()`, which dp2ddp does not evaluate ahead of time", n
            if isinstance(n, (ast.Name, ast.Attribute)) and isinstance(getattr(n, "ctx", None), ast.Load):
                if isinstance(m.parent(n), ast.Call) and m.parent(n).func is n:  # type: ignore[union-attr]
                    continue
                read.add(ast.unparse(n))
    # what the statements between the start and the test bind
    shifts: Dict[str, int] = {}
    for n in own_nodes(m, loop):
        pos = (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))
        if not start <= pos < gate_start:
            continue
        for target in (x for t in assignment_targets(n) for x in flat_targets(t)):
            text = ast.unparse(target)
            hit = next((r for r in read if r == text or r.startswith(text + ".") or r.startswith(text + "[")), None)
            if hit is None:
                continue
            if (
                isinstance(n, ast.AugAssign)
                and text == hit
                and isinstance(n.op, (ast.Add, ast.Sub))
                and isinstance(n.value, ast.Constant)
                and type(n.value.value) is int
                and m.parent(n) is loop
            ):
                shifts[text] = shifts.get(text, 0) + (n.value.value if isinstance(n.op, ast.Add) else -n.value.value)
                continue
            return None, f"`{hit}` is set at line {n.lineno}, after the forward", n
    parts = [_condition_text(m, _shift(t, shifts) if shifts else t, positive, bool(shifts), len(tests) > 1) for t, positive in tests]
    acc.substituted = {k: f"{k} {'+' if v >= 0 else '-'} {abs(v)}" for k, v in shifts.items() if v}
    return " and ".join(parts), None, None


_INVERSE = {
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt,
    ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}


def _condition_text(m: SemanticModel, expr: ast.AST, positive: bool, rewritten: bool, several: bool) -> str:
    """One test of the gate as code: the original text where it is unchanged and on one
    line; a negated comparison inverts its operator (``!=`` -> ``==``)."""
    if not positive and isinstance(expr, ast.Compare) and len(expr.ops) == 1:
        expr = ast.Compare(left=expr.left, ops=[_INVERSE[type(expr.ops[0])]()], comparators=expr.comparators)
        positive, rewritten = True, True
    text = ast.unparse(expr) if rewritten else m.source(expr)
    if "\n" in text:
        text = ast.unparse(expr)
    if not positive:
        atomic = isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant))
        return f"not {text}" if atomic else f"not ({text})"
    if isinstance(expr, (ast.IfExp, ast.Lambda, ast.NamedExpr)) or (several and isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or)):
        return f"({text})"
    return text


class _Shift(ast.NodeTransformer):
    def __init__(self, shifts: Dict[str, int]) -> None:
        self.shifts = shifts

    def _shifted(self, node: ast.AST) -> ast.AST:
        k = self.shifts.get(ast.unparse(node), 0)
        if not k:
            return node
        op = ast.Add() if k > 0 else ast.Sub()
        return ast.BinOp(left=node, op=op, right=ast.Constant(abs(k)))

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return self._shifted(node)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if ast.unparse(node) in self.shifts:
            return self._shifted(node)
        return self.generic_visit(node)


def _shift(test: ast.AST, shifts: Dict[str, int]) -> ast.AST:
    return _Shift(shifts).visit(copy.deepcopy(test))


def accumulations(m: SemanticModel) -> List[Accumulation]:
    """Every loop whose optimizer step follows only some of its backward passes."""
    got = m.cache.get("steps:accumulations")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Accumulation] = []
    by_loop: Dict[ast.AST, List[ast.Call]] = {}
    for b in backward_calls(m):
        loop = innermost_loop(m, b)
        if loop is not None:
            by_loop.setdefault(loop, []).append(b)
    keys = wrapper_keys(m, wrapped_vars(m, dp=True)) if by_loop else set()
    for loop, backs in by_loop.items():
        steps = optimizer_steps(m, loop)
        last = backs[-1]
        after = [s for s in steps if (s.lineno, s.col_offset) > (last.end_lineno, last.end_col_offset)]  # type: ignore[operator]
        if not after:
            continue
        step = after[0]
        gate = _gate(m, loop, last, step, steps)
        if not gate or not _shaped(m, loop, [t for t, _ in gate]):
            continue
        acc = Accumulation(loop=loop, step=step, backward=last, gate=gate)
        out.append(acc)
        body = loop.body  # type: ignore[attr-defined]
        b_index = next(i for i, s in enumerate(body) if m.contains(s, last))
        forwards: List[Tuple[VarKey, ast.AST]] = []
        f_index = None
        for i, s in enumerate(body[: b_index + 1]):
            got_fw = _forward_of(m, s, keys)
            if got_fw and f_index is None:
                f_index = i
            forwards.extend(got_fw)
        gate_node = gate[0][0]
        if f_index is None:
            acc.keep_sync, acc.keep_sync_node = "dp2ddp finds no forward of the wrapped model in this loop", gate_node
            continue
        models = {k for k, _ in forwards}
        if len(models) > 1:
            names = ", ".join(sorted(k[2] for k in models))
            acc.keep_sync, acc.keep_sync_node = f"the loop runs the forward of several wrapped models ({names})", gate_node
            continue
        # (when the step is inside the last of these statements it runs under the same context: harmless,
        # no_sync only changes what DDP's forward and backward do)
        acc.first, acc.last, acc.wrapper = body[f_index], body[b_index], forwards[0][1]
        condition, problem, where = _read_early(m, loop, acc, gate)
        if problem is not None:
            acc.problem, acc.problem_node = problem, where
            continue
        acc.condition = condition
        first_back = backs[0]
        between = [
            n for n in own_nodes(m, loop)
            if (first_back.lineno, first_back.col_offset) <= (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))
            and not any(m.contains(t, n) for t, _ in gate)
            and not _under_gate(m, n, gate)
            and (getattr(n, "lineno", 0), getattr(n, "col_offset", 0)) < (step.lineno, step.col_offset)
        ]
        reads = grad_reads(m, between)
        if reads:
            r = reads[0]
            what = ast.unparse(r.func) + "(...)" if isinstance(r, ast.Call) else ast.unparse(r)
            acc.keep_sync = (
                f"`{what}` reads the gradients after every backward pass, also those the optimizer does not step on, "
                "where under no_sync each process would hold only its own partial sum"
            )
            acc.keep_sync_node = r
    m.cache["steps:accumulations"] = out
    return out


def _under_gate(m: SemanticModel, node: ast.AST, gate: List[Tuple[ast.AST, bool]]) -> bool:
    """``node`` runs only when the step does (it is in the branch of a gating ``if``)."""
    for test, positive in gate:
        owner = m.parent(test)
        if isinstance(owner, ast.If) and owner.test is test:
            branch = owner.body if positive else owner.orelse
            if any(m.contains(s, node) for s in branch):
                return True
    return False
