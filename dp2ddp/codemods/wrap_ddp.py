"""Replace ``DataParallel(...)`` wraps by ``DistributedDataParallel``.

* ``DataParallel(m, device_ids=..., output_device=...)`` becomes
  ``DistributedDataParallel(m, device_ids=[current device] if CUDA else None)``; the
  device ids of DP do not carry over (each process owns one device).
* The module is on its device before it is wrapped: ``DP(m).cuda()`` becomes
  ``DDP(m.cuda())``, and ``m = DP(m)`` followed by ``m.to(device)`` moves the wrap below
  the ``.to``.
* A wrap under ``if`` (``if torch.cuda.device_count() > 1:``) is moved after the
  ``if``: every rank must wrap, also on CPU, or the ranks train apart.
* A partial wrap (``model.features = DP(model.features)``) becomes one wrap of the whole
  model, so that DDP averages the gradients of every trained parameter.
* Type references (``isinstance(m, nn.DataParallel)``) name the new wrapper.

Anything else (``dim != 0``, unknown arguments, aliases, subclasses) blocks the file.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from dp2ddp.analysis import code
from dp2ddp.codemods.context import MigrationContext
from dp2ddp.engine import Finding, Fix, InsertAfter, Remove, RemoveImportIfUnused, Replace

CODE_WRAP = "DDP100"
CODE_UNSUPPORTED = "DDP101"
CODE_PARTIAL = "DDP102"
CODE_HOISTED = "DDP103"

MODULE_RETURNING = {"cuda", "to", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "type"}
PLACEMENT = {"cuda", "to"}
MODULE_LIKE_ATTRS = {"parameters", "named_parameters", "to", "cuda", "train", "eval", "state_dict", "load_state_dict", "zero_grad"}
DP_MODULES = {"torch.nn", "torch.nn.parallel", "torch.nn.parallel.data_parallel"}


class _Hoist:
    def __init__(self, anchor: cst.CSTNode, target: cst.BaseExpression) -> None:
        self.anchor = anchor
        self.target = target
        self.carry_leading: List[cst.EmptyLine] = []
        self.carry_comment: Optional[cst.TrailingWhitespace] = None


def propose(ctx: MigrationContext) -> List[Finding]:
    an = ctx.an
    findings: List[Finding] = []
    hoists: Dict[Tuple[int, str], _Hoist] = {}
    for ref in ctx.dp_refs:
        parent = an.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            findings.extend(_wrap_site(ctx, parent, hoists))
        elif _is_type_position(an, ref):
            f = ctx.note(ref, CODE_WRAP, "type check now names DistributedDataParallel")
            f.fix = Fix([Replace(ref, cst.Name(ctx.name("DDP")))])
            tuple_node = an.parent(an.parent(ref)) if isinstance(an.parent(ref), cst.Element) else None
            if isinstance(tuple_node, cst.Tuple):
                f.fix.edits.append(Replace(tuple_node, _dedupe_elements))
            findings.append(f)
        else:
            findings.append(
                ctx.block(ref, CODE_UNSUPPORTED, "DataParallel is used indirectly (alias, subclass or argument); migrate this by hand")
            )
    for hoist in hoists.values():
        findings.append(_insert_hoisted(ctx, hoist))
    findings.extend(_remove_imports(ctx))
    return findings


def _dedupe_elements(tup: cst.Tuple) -> cst.BaseExpression:
    """``(DDP, DDP)`` after two DataParallel spellings were replaced: keep one."""
    if not isinstance(tup, cst.Tuple):
        return tup  # already reduced by the edit of another element
    seen, kept = set(), []
    for el in tup.elements:
        text = code(el.value)
        if text not in seen:
            seen.add(text)
            kept.append(el)
    if len(kept) == len(tup.elements):
        return tup
    if len(kept) == 1:
        return kept[0].value
    kept[-1] = kept[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return tup.with_changes(elements=kept)


def _is_type_position(an, ref) -> bool:
    """``isinstance(x, DP)``, ``isinstance(x, (DP, ...))``, ``type(x) is DP``."""
    cur, parent = ref, an.parent(ref)
    if isinstance(parent, cst.Element) and isinstance(an.parent(parent), cst.Tuple):
        cur = an.parent(parent)
        parent = an.parent(cur)
    if isinstance(parent, cst.Arg):
        call = an.parent(parent)
        if isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value in ("isinstance", "issubclass"):
            return list(call.args).index(parent) == 1
    if isinstance(parent, cst.ComparisonTarget) and isinstance(parent.operator, (cst.Is, cst.IsNot, cst.Equal, cst.NotEqual)):
        return True
    if isinstance(parent, cst.Comparison) and parent.left is ref:
        return True
    return False


def _dp_module_arg(ctx: MigrationContext, call: cst.Call) -> Tuple[Optional[cst.BaseExpression], Optional[str]]:
    """The wrapped module expression, or ``(None, reason)``."""
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in call.args):
        return None, "*args/**kwargs in the DataParallel call"
    keywords = {a.keyword.value: a for a in call.args if a.keyword is not None}
    unknown = set(keywords) - {"module", "device_ids", "output_device", "dim"}
    if unknown:
        return None, f"DataParallel argument {sorted(unknown)[0]}= has no DistributedDataParallel equivalent"
    if len(positional) > 4:
        return None, "too many DataParallel arguments"
    dim = positional[3].value if len(positional) > 3 else (keywords["dim"].value if "dim" in keywords else None)
    if dim is not None and not (isinstance(dim, cst.Integer) and dim.value == "0"):
        return None, f"DataParallel(dim={code(dim)}) scatters along another dimension; DistributedDataParallel cannot express it"
    module = positional[0].value if positional else (keywords["module"].value if "module" in keywords else None)
    if module is None:
        return None, "DataParallel call without a module"
    return module, None


def _chain(an, call: cst.Call) -> cst.BaseExpression:
    """Outermost ``DP(m).cuda().float()`` style chain of module-returning calls."""
    cur: cst.BaseExpression = call
    while True:
        attr = an.parent(cur)
        outer = an.parent(attr) if attr is not None else None
        if (
            isinstance(attr, cst.Attribute)
            and attr.value is cur
            and attr.attr.value in MODULE_RETURNING
            and isinstance(outer, cst.Call)
            and outer.func is attr
        ):
            cur = outer
            continue
        return cur


def _small_statement(an, node) -> Optional[cst.BaseSmallStatement]:
    for a in an.ancestors(node):
        if isinstance(a, cst.BaseSmallStatement):
            return a
        if isinstance(a, cst.BaseStatement):
            return None
    return None


def _root_name(expr: cst.BaseExpression) -> Optional[cst.Name]:
    while isinstance(expr, cst.Attribute):
        expr = expr.value
    return expr if isinstance(expr, cst.Name) else None


def _module_like(ctx: MigrationContext, name: str) -> bool:
    for call in ctx.an.nodes_of(cst.Call):
        f = call.func
        if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == name and f.attr.value in MODULE_LIKE_ATTRS:
            return True
    return False


def _wrap_site(ctx: MigrationContext, call: cst.Call, hoists) -> List[Finding]:
    an = ctx.an
    module, reason = _dp_module_arg(ctx, call)
    if module is None:
        return [ctx.block(call, CODE_UNSUPPORTED, f"{reason}; left unchanged")]
    outer = _chain(an, call)
    inner = module if outer is call else outer.deep_replace(call, module)
    stmt = an.statement_of(call)
    small = _small_statement(an, call)
    if stmt is None or small is None:
        return [ctx.block(call, CODE_UNSUPPORTED, "DataParallel inside a one-line compound statement; migrate this by hand")]
    ifs = an.enclosing_ifs(stmt)
    target = None
    if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is outer:
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
        elif isinstance(small, cst.AnnAssign):
            target = small.target
        if not isinstance(target, (cst.Name, cst.Attribute)):
            target = None

    partial_root = None
    if isinstance(target, cst.Attribute) and code(target) == code(module):
        root = _root_name(target)
        if root is not None and root.value == "self":
            cls = an.enclosing_class(stmt)
            if cls is not None and an.class_is_module(cls):
                return [
                    ctx.block(
                        call,
                        CODE_UNSUPPORTED,
                        "DataParallel wraps a sub-module inside an nn.Module; wrap the whole model where it is built instead",
                    )
                ]
        elif root is not None:
            if not _module_like(ctx, root.value):
                return [ctx.block(call, CODE_UNSUPPORTED, f"cannot tell whether {root.value} is the model; migrate this wrap by hand")]
            partial_root = root

    if not ifs and partial_root is None:
        # in place; move below an immediately following `.to(device)` of the same target
        if target is not None:
            anchor = _absorb_placement(an, stmt, target)
            if anchor is not stmt:
                hoist = _register(hoists, anchor, target)
                edits = _unwrap_in_place(an, stmt, outer, inner, target, hoist)
                f = ctx.note(call, CODE_WRAP, "DataParallel -> DistributedDataParallel, after the module is placed on its device")
                f.fix = Fix(edits)
                return [f]
        f = ctx.note(call, CODE_WRAP, "DataParallel -> DistributedDataParallel")
        f.fix = Fix([Replace(outer, ctx.ddp_call(inner))])
        return [f]

    if target is None:
        return [
            ctx.block(call, CODE_UNSUPPORTED, "DataParallel under a condition in a form dp2ddp cannot move out of it; migrate this by hand")
        ]
    wrap_target = cst.Name(partial_root.value) if partial_root is not None else target
    anchor = ifs[-1] if ifs else stmt
    anchor = _absorb_placement(an, anchor, wrap_target)
    hoist = _register(hoists, anchor, wrap_target)
    edits = _unwrap_in_place(an, stmt, outer, inner, target, hoist)
    if ifs and any(isinstance(e, Remove) for e in edits):
        edits = _drop_emptied_if(an, ifs[0], stmt, hoist) or edits
    out: List[Finding] = []
    if partial_root is not None:
        f = ctx.note(
            call,
            CODE_PARTIAL,
            f"partial DataParallel wrap of {code(target)}: the whole {partial_root.value} is wrapped once in "
            "DistributedDataParallel so that every trained parameter is averaged across ranks",
        )
    else:
        test = code(ifs[0].test) if ifs else ""
        f = ctx.note(
            call,
            CODE_HOISTED,
            f"DistributedDataParallel wrap moved out of `if {test}:` so that every rank wraps, also on CPU",
        )
    f.fix = Fix(edits)
    out.append(f)
    return out


def _register(hoists, anchor, target) -> _Hoist:
    key = (id(anchor), code(target))
    if key not in hoists:
        hoists[key] = _Hoist(anchor, target)
    return hoists[key]


def _unwrap_in_place(an, stmt, outer, inner, target, hoist: Optional[_Hoist]) -> list:
    """Replace the wrap by the bare module; drop the statement if it became ``x = x``."""
    if code(inner) == code(target):
        line = stmt
        if hoist is not None and isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            # the statement moves: keep its comments with it
            hoist.carry_leading.extend(line.leading_lines)
            if line.trailing_whitespace.comment is not None and hoist.carry_comment is None:
                hoist.carry_comment = line.trailing_whitespace
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            return [Remove(line)]
        return [Replace(_small_statement(an, outer), cst.RemoveFromParent())]
    return [Replace(outer, inner)]


def _drop_emptied_if(an, if_stmt: cst.If, stmt, hoist: _Hoist) -> Optional[list]:
    """``if cond:`` whose only statement was the wrap (and no ``else``) goes away whole;
    its comments travel with the hoisted wrap."""
    if an.block_owner(stmt) is not if_stmt or if_stmt.orelse is not None:
        return None
    if not isinstance(if_stmt.body, cst.IndentedBlock) or list(if_stmt.body.body) != [stmt]:
        return None
    if an.block_of(if_stmt) is None:
        return None
    hoist.carry_leading[:0] = list(if_stmt.leading_lines)
    return [Remove(if_stmt)]


def _references(node: cst.CSTNode, target: cst.BaseExpression) -> bool:
    text = code(target)
    root = _root_name(target)
    found = []

    class _V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            if isinstance(target, cst.Name) and n.value == target.value:
                found.append(n)

        def visit_Attribute(self, n: cst.Attribute) -> Optional[bool]:
            if isinstance(target, cst.Attribute) and code(n) == text:
                found.append(n)
                return False
            return True

    node.visit(_V())
    if not found and isinstance(target, cst.Attribute) and root is not None and root.value != "self":
        # `model.features` partial targets: any use of the root counts
        node.visit(_RootVisitor(root.value, found))
    return bool(found)


class _RootVisitor(cst.CSTVisitor):
    def __init__(self, name: str, found: list) -> None:
        super().__init__()
        self.name, self.found = name, found

    def visit_Name(self, n: cst.Name) -> None:
        if n.value == self.name:
            self.found.append(n)


def _is_placement(stmt: cst.CSTNode, target: cst.BaseExpression) -> bool:
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return False
    small = stmt.body[0]
    text = code(target)
    value = None
    if isinstance(small, cst.Expr):
        value = small.value
    elif isinstance(small, cst.Assign) and len(small.targets) == 1 and code(small.targets[0].target) == text:
        value = small.value
    return (
        isinstance(value, cst.Call)
        and isinstance(value.func, cst.Attribute)
        and value.func.attr.value in PLACEMENT
        and code(value.func.value) == text
    )


def _absorb_placement(an, anchor: cst.CSTNode, target: cst.BaseExpression) -> cst.CSTNode:
    """Move the insertion point past statements that place ``target`` on its device.

    Statements that do not mention the target may be skipped over, but only when a
    placement follows them; the first other use of the target stops the search."""
    best = anchor
    for s in an.siblings_after(anchor):
        if _is_placement(s, target):
            best = s
            continue
        if _references(s, target):
            break
    return best


def _insert_hoisted(ctx: MigrationContext, hoist: _Hoist) -> Finding:
    target = hoist.target
    stmt = ctx.stmt("{t} = {call}", t=target, call=ctx.ddp_call(target))
    if hoist.carry_leading:
        stmt = stmt.with_changes(leading_lines=hoist.carry_leading)
    if hoist.carry_comment is not None:
        stmt = stmt.with_changes(trailing_whitespace=hoist.carry_comment)
    f = ctx.note(hoist.anchor, CODE_WRAP, f"wrap {code(target)} in DistributedDataParallel here")
    f.fix = Fix([InsertAfter(hoist.anchor, (stmt,))])
    return f


def _remove_imports(ctx: MigrationContext) -> List[Finding]:
    edits = []
    for imp in ctx.an.nodes_of(cst.ImportFrom):
        if imp.module is None or isinstance(imp.names, cst.ImportStar) or imp.relative:
            continue
        mod = code(imp.module)
        if mod not in DP_MODULES:
            continue
        for alias in imp.names:
            if isinstance(alias.name, cst.Name) and alias.name.value == "DataParallel":
                asname = alias.asname.name.value if alias.asname is not None else None
                edits.append(RemoveImportIfUnused(mod, "DataParallel", asname))
    if not edits:
        return []
    f = Finding(CODE_WRAP, "remove the DataParallel import that nothing uses any more", None, severity="info")
    f.fix = Fix(edits)
    return [f]
