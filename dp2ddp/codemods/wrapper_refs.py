"""What refers to the wrapper once the model is wrapped: the model's own attributes and
methods go through ``.module`` (:func:`route_uses`, also for :mod:`functional_dp`), type
checks name DistributedDataParallel (:func:`type_refs`), and the DataParallel import
nothing uses any more goes (:func:`remove_imports`)."""

from __future__ import annotations

import ast
from typing import Dict, List, Set

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, Fix, Replace
from dp2ddp.model.checkpoint_keys import PLAIN, key_policy
from dp2ddp.model.collectives import VarKey, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.syntax import LOOPS
from dp2ddp.model.uses import half_unwrapped, unwrapped_on_the_other_branch, wrapper_keys, wrapper_uses
from dp2ddp.model.wraps import dp_type_refs, dp_wraps, in_annotation

_DP_MODULES = {"torch.nn", "torch.nn.parallel", "torch.nn.parallel.data_parallel"}


def route_uses(ctx: Context, seeds: Set[VarKey], guarded: Set[VarKey], wrap_stmts, flagged: Set[VarKey] = frozenset(),
               bare: bool = False, cuda: Set[VarKey] = frozenset()) -> List[Finding]:
    """``model.predict(x)`` -> ``model.module.predict(x)`` after the wrap; ``state_dict``
    and ``load_state_dict`` too where the keys stay without ``module.``
    (:func:`~dp2ddp.model.checkpoint_keys.key_policy`; ``bare``: the original made no wrapper
    at all, a functional ``data_parallel``)."""
    m = ctx.m
    if not seeds:
        return []
    keys = wrapper_keys(m, seeds)
    guarded_all = wrapper_keys(m, guarded) if guarded else set()
    flagged_all = wrapper_keys(m, set(flagged)) if flagged else set()
    cuda_all = wrapper_keys(m, set(cuda)) if cuda else set()
    policies: Dict[tuple, object] = {}
    edits = []
    first = None
    out: List[Finding] = []
    said = set()
    loads: List[Fix] = []
    first_load = None
    unwraps = {id(n) for n in half_unwrapped(m, guarded_all)}
    for use in wrapper_uses(m, keys):
        if use.kind == "other" and id(use.node) in unwraps and not _before_any_wrap(m, use.node, wrap_stmts):
            # ``if parallel: model_ = model.module else: model_ = model``: the bare model on
            # both paths of the original; the migrated wrap runs on both
            alias = m.source(m.parent(use.node).targets[0])  # type: ignore[attr-defined]
            out.append(ctx.note(use.node, "DDP124", (
                f"`{alias} = {m.source(use.node)}` takes `.module` too: the script unwraps on the other path, so {alias} held "
                f"the bare model wherever the original ran, and the migrated wrap runs on every path"),
                [Replace(ctx.cst(use.node), ctx.expr(ctx.module_of(m.source(use.node))))]))
            continue
        if use.kind not in ("attribute", "store", "state_dict"):
            continue
        if use.kind == "state_dict" and use.attr == "load_state_dict" and not _before_any_wrap(m, use.node, wrap_stmts):
            got = _load_either(ctx, use.node)
            if got is not None:
                loads.extend(got)
                first_load = first_load or use.node
                continue
        if use.kind == "state_dict" and unwrapped_on_the_other_branch(m, use.node):
            # ``net.module.state_dict() if parallel else net.state_dict()``: bare keys on both paths, as the original's
            out.append(ctx.note(use.node, "DDP150", (
                f"state_dict keys of {m.source(use.node)} without `module.` (through `.module`) on both branches: the "
                "original unwrapped its DataParallel on the other branch, so it wrote the bare model's keys either way")))
        elif use.kind == "state_dict":
            key = var_key(m, use.node)
            g = (key in guarded_all, key in flagged_all, bare, key in cuda_all)
            policy = policies.get(g) or policies.setdefault(g, key_policy(m, *g))
            if policy.reason not in said:
                said.add(policy.reason)
                keys_text = "without `module.` (through `.module`)" if policy.default == PLAIN else "with `module.`"
                out.append(ctx.note(use.node, "DDP150", f"state_dict keys of {m.source(use.node)} {keys_text}: {policy.reason}"))
            if policy.default != PLAIN:
                continue
        if _before_any_wrap(m, use.node, wrap_stmts):
            continue
        edits.append(Replace(ctx.cst(use.node), ctx.expr(ctx.module_of(m.source(use.node)))))
        first = first or use.node
    if loads:
        out.append(ctx.note(first_load, "DDP170", (
            f"{m.source(first_load)}.load_state_dict(...) loads into the bare model through load_either_keys(...): "
            "a checkpoint saved with DataParallel's `module.` key prefix (where the original's wrap ran) or without "
            "it loads either way"), loads))
    if not edits:
        return out
    return out + [ctx.note(first, "DDP124", "the model's own attributes and methods are used through `.module` of the DistributedDataParallel wrapper", edits)]


def _load_either(ctx: Context, node: ast.AST):
    """``net.load_state_dict(sd, ...)`` after the wrap -> ``load_either_keys(net.module)(sd, ...)``:
    whichever keys the file has (``module.`` where the original's DataParallel wrap ran, plain
    elsewhere), the bare model takes them. Only the called attribute is replaced, so what other
    transforms do inside the arguments (``map_location``) stays theirs. None for anything but a
    call of it."""
    m = ctx.m
    attr = m.parent(node)
    call = m.parent(attr)
    if not (isinstance(call, ast.Call) and call.func is attr):
        return None
    helper = ctx.load_either_keys()
    return [Replace(ctx.cst(attr), ctx.expr(f"{helper}({ctx.module_of(m.source(node))})"))]


def _before_any_wrap(m: SemanticModel, node: ast.AST, wrap_stmts) -> bool:
    """A use in the function (or module level) of a wrap of the same variable, before it
    (``wrap_stmts``: ``(statement, wrapped variable's text or None for any)``)."""
    func = m.enclosing_function(node)
    text = m.source(node)
    for s, wrapped in wrap_stmts:
        if wrapped is not None and wrapped != text:
            continue  # another model's wrap (netD's below netG's load_state_dict)
        fork = m.parent(s)
        if (isinstance(fork, ast.If) and s in fork.body and any(x is node or m.contains(x, node) for x in fork.orelse)
                and not any(isinstance(a, LOOPS) for a in m.ancestors(fork) if m.enclosing_function(a) is func)):
            return True  # the other branch of the wrap's ``if``: it never holds that wrapper (and the wrap moves below it)
        if m.enclosing_function(s) is func and (node.lineno, node.col_offset) < (s.lineno, s.col_offset):
            loop = next((a for a in m.ancestors(node) if isinstance(a, LOOPS) and m.contains(a, s)), None)
            if loop is None or _made_again_first(m, loop, node, text, s):
                return True
    return False


def _made_again_first(m: SemanticModel, loop: ast.AST, node: ast.AST, text: str, wrap: ast.AST) -> bool:
    """In every pass of ``loop``, ``text`` is bound afresh (not by the wrap) by a statement of
    the loop's own body before the one that holds ``node``: ``for ind in inds: net = Net();
    net.load_state_dict(...); net = DataParallel(net)`` loads into the bare model on every
    pass, not into the previous pass's wrapper."""
    for stmt in getattr(loop, "body", []):
        if m.contains(stmt, node) or stmt is node:
            return False
        if stmt is wrap or m.contains(stmt, wrap):
            continue
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(m.source(t) == text for t in targets):
                return True
    return False


def type_refs(ctx: Context) -> List[Finding]:
    m = ctx.m
    out = []
    done_tuples = set()
    for ref in dp_type_refs(m):
        if ctx.role == "helper" and _type_argument(m, ref):
            # a project module other scripts import, some of which may keep DataParallel (refused,
            # or not migrated): the test accepts both wrappers
            text = m.source(ref)
            out.append(ctx.note(ref, "DDP100", "type check now names DistributedDataParallel too (the module is shared with "
                                "scripts that may still wrap in DataParallel)",
                                [Replace(ctx.cst(ref), ctx.expr(f"({text}, {ctx.name('DDP')})"))]))
            continue
        edits = [Replace(ctx.cst(ref), cst.Name(ctx.name("DDP")))]
        parent = m.parent(ref)
        if isinstance(parent, ast.Tuple) and id(parent) not in done_tuples:
            done_tuples.add(id(parent))
            edits.append(Replace(ctx.cst(parent), _dedupe_elements))
        out.append(ctx.note(ref, "DDP100", f"type {'hint' if in_annotation(m, ref) else 'check'} now names DistributedDataParallel", edits))
    return out


def _type_argument(m: SemanticModel, ref: ast.AST) -> bool:
    """``ref`` is the class argument of ``isinstance``/``issubclass`` (alone: a tuple in its
    place is valid there)."""
    parent = m.parent(ref)
    return (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name) and parent.func.id in ("isinstance", "issubclass")
            and len(parent.args) == 2 and parent.args[1] is ref)


def _dedupe_elements(tup):
    """``(DDP, DDP)`` after two DataParallel spellings were replaced: keep one."""
    if not isinstance(tup, cst.Tuple):
        return tup
    seen, kept = set(), []
    for el in tup.elements:
        text = cst.Module(body=[]).code_for_node(el.value)
        if text not in seen:
            seen.add(text)
            kept.append(el)
    if len(kept) == len(tup.elements):
        return tup
    if len(kept) == 1:
        return kept[0].value
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return tup.with_changes(elements=kept)


def remove_imports(ctx: Context) -> List[Finding]:
    # and a project's DataParallel with replication callbacks the wraps no longer call (model/sync_bn.py)
    callbacks = {q for w in dp_wraps(ctx.m) if w.sync_bn for q in ctx.m.qualified_names(w.call.func)}
    edits = ctx.unused_imports(lambda module, alias: (module in _DP_MODULES and alias.name in ("DataParallel", "data_parallel"))
                               or f"{module}.{alias.name}" in callbacks)
    if not edits:
        return []
    f = ctx.finding(None, "DDP100", "remove the DataParallel import that nothing uses any more", "info", Fix(edits))
    f.line = 0
    return [f]
