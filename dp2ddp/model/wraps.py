"""DataParallel in a module: wraps (class and functional form), type checks, other uses,
and spellings that cannot be resolved.

* :func:`dp_wraps`: every ``DataParallel(m, ...)`` call and every functional
  ``data_parallel(module, inputs, device_ids, ...)`` call, with what the migration needs
  to know about it (the wrapped module, the variable it is assigned to, the conditions
  around it, whether it only serves evaluation).
* :func:`dp_subclasses`: classes of this module derived from DataParallel, and for each
  why DistributedDataParallel cannot stand in for its base (``None``: it can; then its
  calls are wraps like DataParallel's, with ``Wrap.cls`` the class).
* :func:`dp_type_refs`: ``isinstance(m, nn.DataParallel)``, ``type(m) in (DP, DDP)``:
  code that tells the wrapper from the module; and type hints (``-> nn.DataParallel``).
* :func:`dp_other_refs`: any other use (an alias, a subclass, an argument).
* :func:`unresolved_dp`: code that names DataParallel in a way the model cannot
  resolve (star imports, ``getattr``, a class of another package named ``*DataParallel``).

The idioms written for DataParallel around a wrap (``if n_gpu > 1: loss = loss.mean()``,
project helpers that assert a DataParallel) are :mod:`dp2ddp.model.dp_idioms`'s; where a
wrap stands (returned by a function, fresh each pass of a loop, in a branch that exits)
:mod:`dp2ddp.model.wrap_context`'s.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from dp2ddp.model.call_args import DATA_PARALLEL_FUNCTIONAL_PARAMS, DATA_PARALLEL_PARAMS, argument
from dp2ddp.model.collectives import outer_chain, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DDP, DP, DP_FUNCTIONAL
from dp2ddp.model.sync_bn import callback_class, patcher_calls
from dp2ddp.model.syntax import FUNCTIONS, is_main_test

@dataclass
class Wrap:
    call: ast.Call
    functional: bool
    module: Optional[ast.AST]  # the wrapped module expression
    problem: Optional[str]  # why this wrap cannot be migrated automatically
    outer: ast.AST  # DP(m).cuda(): the outermost module-returning call
    stmt: ast.stmt
    target: Optional[ast.AST]  # what the wrapper is assigned to (Name / Attribute)
    function: Optional[ast.AST]
    conditions: List[ast.AST] = field(default_factory=list)  # ifs around it in its block chain, innermost first
    args: dict = field(default_factory=dict)  # device_ids / output_device / dim / inputs expressions
    cls: Optional[ast.ClassDef] = None  # a subclass of DataParallel of this module that the call makes
    sync_bn: bool = False  # a project's DataParallel with replication callbacks (sync_bn.py): BatchNorm across devices

    @property
    def guarded(self) -> bool:
        return bool(self.conditions)


def _problem(call: ast.Call, functional: bool) -> Optional[str]:
    names = DATA_PARALLEL_FUNCTIONAL_PARAMS if functional else DATA_PARALLEL_PARAMS
    what = "data_parallel" if functional else "DataParallel"
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return f"*args/**kwargs in the {what} call"
    unknown = sorted({k.arg for k in call.keywords} - set(names))
    if unknown:
        return f"{what} argument {unknown[0]}= has no DistributedDataParallel equivalent"
    if len(call.args) > len(names):
        return f"too many {what} arguments"
    dim = argument(call, names, "dim")
    # DataParallel(dim != 0): dp2ddp.model.batches decides whether its batches can be split on that dimension
    if functional and dim is not None and not (isinstance(dim, ast.Constant) and dim.value == 0):
        return f"{what}(dim={ast.unparse(dim)}) scatters along another dimension; DistributedDataParallel cannot express it"
    if argument(call, names, "module") is None:
        return f"{what} call without a module"
    if functional and argument(call, names, "inputs") is None:
        return "data_parallel call without inputs"
    if functional and argument(call, names, "module_kwargs") is not None:
        return "data_parallel(module_kwargs=...) is not migrated"
    return None


def conditions(m: SemanticModel, stmt: ast.stmt) -> List[ast.AST]:
    """``if`` statements whose branches hold ``stmt``, up to its function, loop or ``with``,
    innermost first; the ``__main__`` guard does not count."""
    out = []
    for a, where in m.branches(stmt, stop=(ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.ExceptHandler)):
        if isinstance(a, ast.Try):
            break
        if not isinstance(a, ast.If):
            continue
        if is_main_test(a.test) and m.parent(a) is m.tree:
            break
        if where != "test":
            out.append(a)
    return out


def dp_wraps(m: SemanticModel) -> List[Wrap]:
    got = m.cache.get("wraps:dp")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Wrap] = []
    subclasses = {id(c): c for c, why in dp_subclasses(m).values() if why is None}
    made = [(c, subclasses[id(k)]) for c in m.nodes(ast.Call) for k in [_class_called(m, c)] if k is not None and id(k) in subclasses]
    cls_of = {id(c): k for c, k in made}
    callbacks = {id(c): c for c in m.nodes(ast.Call) if callback_class(m, c) is not None}
    # a wrapper handed to the package's patch_replication_callback() synchronises BatchNorm too
    patched = {var_key(m, c.args[0]) for c in patcher_calls(m) if c.args}
    calls = sorted(m.calls(DP | DP_FUNCTIONAL) + [c for c, _k in made] + list(callbacks.values()), key=lambda c: (c.lineno, c.col_offset))
    only_keys = {id(c) for c in key_only_wraps(m)}
    for call in calls:
        if id(call) in only_keys:
            continue  # a wrapper made only to load `module.` keys: no wrap to migrate (it stays as it was)
        functional = m.is_name(call.func, DP_FUNCTIONAL) and not m.is_name(call.func, DP) and id(call) not in cls_of
        names = DATA_PARALLEL_FUNCTIONAL_PARAMS if functional else DATA_PARALLEL_PARAMS
        outer = outer_chain(m, call) if not functional else call
        stmt = m.statement_of(call)
        target = None
        parent = m.parent(outer)
        if isinstance(parent, ast.Assign) and parent.value is outer and len(parent.targets) == 1:
            target = parent.targets[0]
        elif isinstance(parent, ast.AnnAssign) and parent.value is outer:
            target = parent.target
        if not isinstance(target, (ast.Name, ast.Attribute)):
            target = None
        args = {n: argument(call, names, n) for n in names if n != "module"}
        out.append(
            Wrap(
                call=call,
                functional=functional,
                module=argument(call, names, "module"),
                problem=_problem(call, functional),
                outer=outer,
                stmt=stmt,  # type: ignore[arg-type]
                target=target,
                function=m.enclosing_function(call),
                conditions=conditions(m, stmt) if stmt is not None else [],
                args=args,
                cls=cls_of.get(id(call)),
                sync_bn=id(call) in callbacks or (target is not None and var_key(m, target) in patched),
            )
        )
    m.cache["wraps:dp"] = out
    return out


# the calls that read or write a model's keys (a key-only wrap's, a handed wrapper's: handed_wrappers)
KEY_METHODS = ("state_dict", "load_state_dict")


def key_only_wraps(m: SemanticModel) -> List[ast.Call]:
    """``net_tmp = nn.DataParallel(net)`` made only to read a checkpoint with DataParallel's
    ``module.`` keys (osmr/imgclsmob's ``prepare_model``: ``net_tmp.load_state_dict(ckpt);
    net.load_state_dict(net_tmp.module.cpu().state_dict())``): a local name of its own that the
    function only loads a state dict into, reads a state dict from, or takes ``.module`` of
    (never calls, hands on, returns or binds again). Nothing runs through that wrapper: it is no
    wrap to migrate, and it stays as it was (DistributedDataParallel would need a process group
    to do the same)."""
    got = m.cache.get("wraps:key_only")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[ast.Call] = []
    for call in m.calls(DP):
        parent = m.parent(call)
        if not (isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1
                and isinstance(parent.targets[0], ast.Name)):
            continue
        name = parent.targets[0].id
        module = argument(call, DATA_PARALLEL_PARAMS, "module")
        if not isinstance(module, ast.Name) or module.id == name:
            continue
        scope = m.enclosing_function(call) or m.tree
        uses = [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name and n is not parent.targets[0]]
        loads = 0
        for n in uses:
            attr = m.parent(n)
            if not (isinstance(n.ctx, ast.Load) and isinstance(attr, ast.Attribute) and attr.value is n):
                break
            if attr.attr in KEY_METHODS:
                call_of = m.parent(attr)
                if not (isinstance(call_of, ast.Call) and call_of.func is attr):
                    break
                loads += attr.attr == "load_state_dict"
            elif attr.attr != "module":
                break
        else:
            if loads:
                out.append(call)
    m.cache["wraps:key_only"] = out
    return out


# what DataParallel has and DistributedDataParallel does not: a subclass that overrides or
# reads one of them is written for DataParallel's scatter/replicate/gather machinery
_DP_ONLY = frozenset({"scatter", "gather", "replicate", "parallel_apply", "src_device_obj", "chunk_sizes",
                      "_sync_params", "replicas"})
# methods a subclass may define: they keep meaning the same on DistributedDataParallel
_KEPT_METHODS = frozenset({"__getattr__", "__setattr__", "__dir__", "state_dict", "load_state_dict", "__repr__"})


def dp_subclasses(m: SemanticModel) -> Dict[int, tuple]:
    """``{id(class): (class, why)}`` for each class of this module whose base is
    DataParallel; ``why`` is ``None`` where the class can derive from DistributedDataParallel
    instead (it adds or overrides only what means the same there: attribute fall-through to
    ``.module``, ``state_dict``), else the reason it cannot."""
    got = m.cache.get("wraps:subclasses")
    if got is not None:
        return got  # type: ignore[return-value]
    out: Dict[int, tuple] = {}
    for cls in m.nodes(ast.ClassDef):
        bases = [b for b in cls.bases if m.is_name(b, DP)]
        if not bases:
            continue
        why = None
        if len(cls.bases) != 1 or cls.keywords or cls.decorator_list:
            why = f"class {cls.name} has other bases, keywords or decorators besides DataParallel"
        methods = [st.name for st in cls.body if isinstance(st, FUNCTIONS)]
        odd = [n for n in methods if n in _DP_ONLY] or [
            n for n in methods if n not in _KEPT_METHODS and (n in ("__init__", "forward") or n.startswith("_"))]
        if why is None and odd:
            why = f"class {cls.name} overrides {odd[0]}(), which works differently in DistributedDataParallel"
        for stmt in cls.body:
            if why is not None:
                break
            if not isinstance(stmt, FUNCTIONS + (ast.Pass,)) and not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                why = f"class {cls.name} has a class-level statement (line {stmt.lineno})"
        if why is None:
            used = sorted({n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute) and n.attr in _DP_ONLY})
            if used:
                why = f"class {cls.name} uses DataParallel's {', '.join(used)}, which DistributedDataParallel does not have"
        if why is None and _class_referenced_apart(m, cls):
            why = f"class {cls.name} is used other than by calling it (a type check, an alias or an argument)"
        out[id(cls)] = (cls, why)
    m.cache["wraps:subclasses"] = out
    return out


def _class_called(m: SemanticModel, call: ast.Call) -> Optional[ast.ClassDef]:
    f = call.func
    if not isinstance(f, ast.Name):
        return None
    where, bindings = m.lookup(f.id, m.scope_of(f))
    if where is None or len(bindings) != 1 or bindings[0].kind != "class":
        return None
    node = bindings[0].node
    return node if isinstance(node, ast.ClassDef) else None


def _class_referenced_apart(m: SemanticModel, cls: ast.ClassDef) -> bool:
    for n in m.nodes(ast.Name):
        if n.id != cls.name or not isinstance(n.ctx, ast.Load):
            continue
        parent = m.parent(n)
        if isinstance(parent, ast.Call) and parent.func is n:
            continue
        if m.enclosing_class(n) is cls:
            continue  # super(MyDataParallel, self)
        return True
    return False


_TYPE_CHECKS = frozenset({"builtins.isinstance", "builtins.issubclass"})


def type_position(m: SemanticModel, ref: ast.AST) -> bool:
    """``isinstance(x, DP)``, ``isinstance(x, (DP, ...))``, ``type(x) is DP``,
    ``type(x) in (DP, DDP)``, ``issubclass``; or an annotation (:func:`in_annotation`)."""
    if in_annotation(m, ref):
        return True
    cur, parent = ref, m.parent(ref)
    if isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
        cur, parent = parent, m.parent(parent)
    if isinstance(parent, ast.Call) and m.is_name(parent.func, _TYPE_CHECKS):
        return len(parent.args) == 2 and parent.args[1] is cur
    if isinstance(parent, ast.Compare):
        return all(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in parent.ops)
    return False


def in_annotation(m: SemanticModel, ref: ast.AST) -> bool:
    """``def build(cfg) -> nn.DataParallel:``, ``model: Optional[nn.DataParallel]``: a type
    hint, which runs nothing (kospeech's model builders)."""
    cur, parent = ref, m.parent(ref)
    while isinstance(parent, (ast.Subscript, ast.Tuple, ast.BinOp)):
        cur, parent = parent, m.parent(parent)
    return ((isinstance(parent, ast.arg) and parent.annotation is cur)
            or (isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and parent.returns is cur)
            or (isinstance(parent, ast.AnnAssign) and parent.annotation is cur))


def dp_type_refs(m: SemanticModel) -> List[ast.AST]:
    return [r for r in m.refs(DP) if type_position(m, r)]


def dp_other_refs(m: SemanticModel) -> List[ast.AST]:
    """References to DataParallel that are neither a call nor a type check (nor the base
    of a subclass that can derive from DistributedDataParallel instead)."""
    out = []
    bases = {id(b) for c, why in dp_subclasses(m).values() if why is None for b in c.bases}
    for r in m.refs(DP | DP_FUNCTIONAL):
        parent = m.parent(r)
        if isinstance(parent, ast.Call) and parent.func is r:
            continue
        if id(r) in bases:
            continue
        if type_position(m, r):
            continue
        out.append(r)
    return out


_SPELLED = re.compile(r"(?<!Distributed)DataParallel|^data_parallel$")


def unresolved_dp(m: SemanticModel) -> List[ast.AST]:
    """Names and attributes spelled like DataParallel that do not resolve to torch's (a star
    import, an unknown package's ``*DataParallel`` class, ``getattr(nn, "DataParallel")``)."""
    got = m.cache.get("wraps:unresolved")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[ast.AST] = []
    for n in m.nodes(ast.Name, ast.Attribute):
        ident = n.id if isinstance(n, ast.Name) else n.attr
        if not _SPELLED.search(ident) or not isinstance(getattr(n, "ctx", None), ast.Load):
            continue
        parent = m.parent(n)
        if isinstance(parent, ast.Attribute) and parent.value is n:
            continue  # a prefix of a longer name (nn.DataParallel.foo)
        q = m.qualified_names(n)
        if q & (DP | DP_FUNCTIONAL | DDP):
            continue
        if isinstance(parent, ast.Call) and parent.func is n and callback_class(m, parent) is not None:
            continue  # a project's DataParallel with replication callbacks: a wrap (sync_bn.py)
        if q and all(not x.startswith(("torch.",)) and not _defined_here(m, x) for x in q) and not m.maybe_star(n):
            # an import from another package (BalancedDataParallel, apex): not torch's
            out.append(n)
            continue
        if not q or m.maybe_star(n):
            out.append(n)
    for c in m.nodes(ast.Call):
        if isinstance(c.func, ast.Name) and c.func.id == "getattr" and len(c.args) >= 2:
            s = c.args[1]
            if isinstance(s, ast.Constant) and isinstance(s.value, str) and _SPELLED.search(s.value):
                out.append(c)
    out.sort(key=lambda n: (n.lineno, n.col_offset))
    m.cache["wraps:unresolved"] = out
    return out


def _defined_here(m: SemanticModel, qualified: str) -> bool:
    """A qualified name of something this module defines or assigns (``<locals>`` or a bare
    module-level name), as opposed to something imported."""
    return "<locals>" in qualified or "." not in qualified


def dp_nodes(m: SemanticModel) -> List[ast.AST]:
    """Every place the module names DataParallel in code (:func:`uses_dataparallel`'s
    wraps, type tests, other references and spellings), for asking which function holds one."""
    return [w.call for w in dp_wraps(m)] + dp_type_refs(m) + dp_other_refs(m) + unresolved_dp(m)


def uses_dataparallel(m: SemanticModel) -> bool:
    """The module names DataParallel in code (a wrap, a type test, another reference, or a
    spelling that may be it), not only in a docstring or comment: what a migration acts on."""
    return bool(dp_wraps(m) or dp_type_refs(m) or dp_other_refs(m) or unresolved_dp(m))
