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
  code that tells the wrapper from the module.
* :func:`dp_other_refs`: any other use (an alias, a subclass, an argument).
* :func:`unresolved_dp`: code that names DataParallel in a way the model cannot
  resolve (star imports, ``getattr``, a class of another package named ``*DataParallel``).
* :func:`dp_helper_calls`: the wrapper passed to a function of the project's own modules
  that is written for DataParallel (``patch_replication_callback(model)`` asserting
  ``isinstance(model, DataParallel)``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from dp2ddp.model.collectives import assigned_keys, outer_chain, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DDP, DP, DP_FUNCTIONAL
from dp2ddp.model.project_defs import project_calls
from dp2ddp.model.sync_bn import callback_class, patcher_calls
from dp2ddp.model.syntax import FUNCTIONS, is_main_test, kwarg

_DP_ARGS = ("module", "device_ids", "output_device", "dim")
_FUNCTIONAL_ARGS = ("module", "inputs", "device_ids", "output_device", "dim", "module_kwargs")


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


def _arg(call: ast.Call, names, name: str) -> Optional[ast.AST]:
    i = names.index(name)
    if i < len(call.args) and not any(isinstance(a, ast.Starred) for a in call.args[: i + 1]):
        return call.args[i]
    k = kwarg(call, name)
    return k.value if k is not None else None


def _problem(call: ast.Call, functional: bool) -> Optional[str]:
    names = _FUNCTIONAL_ARGS if functional else _DP_ARGS
    what = "data_parallel" if functional else "DataParallel"
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return f"*args/**kwargs in the {what} call"
    unknown = sorted({k.arg for k in call.keywords} - set(names))
    if unknown:
        return f"{what} argument {unknown[0]}= has no DistributedDataParallel equivalent"
    if len(call.args) > len(names):
        return f"too many {what} arguments"
    dim = _arg(call, names, "dim")
    # DataParallel(dim != 0): dp2ddp.model.batches decides whether its batches can be split on that dimension
    if functional and dim is not None and not (isinstance(dim, ast.Constant) and dim.value == 0):
        return f"{what}(dim={ast.unparse(dim)}) scatters along another dimension; DistributedDataParallel cannot express it"
    if _arg(call, names, "module") is None:
        return f"{what} call without a module"
    if functional and _arg(call, names, "inputs") is None:
        return "data_parallel call without inputs"
    if functional and _arg(call, names, "module_kwargs") is not None:
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
    for call in calls:
        functional = m.is_name(call.func, DP_FUNCTIONAL) and not m.is_name(call.func, DP) and id(call) not in cls_of
        names = _FUNCTIONAL_ARGS if functional else _DP_ARGS
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
        args = {n: _arg(call, names, n) for n in names if n != "module"}
        out.append(
            Wrap(
                call=call,
                functional=functional,
                module=_arg(call, names, "module"),
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


def _type_position(m: SemanticModel, ref: ast.AST) -> bool:
    """``isinstance(x, DP)``, ``isinstance(x, (DP, ...))``, ``type(x) is DP``,
    ``type(x) in (DP, DDP)``, ``issubclass``."""
    cur, parent = ref, m.parent(ref)
    if isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
        cur, parent = parent, m.parent(parent)
    if isinstance(parent, ast.Call) and m.is_name(parent.func, _TYPE_CHECKS):
        return len(parent.args) == 2 and parent.args[1] is cur
    if isinstance(parent, ast.Compare):
        return all(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in parent.ops)
    return False


def dp_type_refs(m: SemanticModel) -> List[ast.AST]:
    return [r for r in m.refs(DP) if _type_position(m, r)]


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
        if _type_position(m, r):
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


# --------------------------------------------------------------------------- idioms

GPU_COUNT = re.compile(r"n_?gpus?$|num_?gpus?$|gpu_?count$|device_count$|world_size$", re.IGNORECASE)


def _identifiers_in(expr: ast.AST):
    for n in ast.walk(expr):
        if isinstance(n, ast.Name):
            yield n.id
        elif isinstance(n, ast.Attribute):
            yield n.attr
        elif isinstance(n, ast.keyword) and n.arg:
            yield n.arg
        elif isinstance(n, ast.arg):
            yield n.arg


def _same_target(a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` are the same expression, whatever their context (load/store)."""
    return ast.dump(a).replace("ctx=Store()", "ctx=Load()") == ast.dump(b)


def _self_mean(stmt: ast.stmt) -> bool:
    """``x = x.mean()``: a value averaged over itself."""
    if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
        return False
    v = stmt.value
    return (
        isinstance(v, ast.Call)
        and isinstance(v.func, ast.Attribute)
        and v.func.attr == "mean"
        and not v.args
        and not v.keywords
        and _same_target(stmt.targets[0], v.func.value)
    )


def dp_loss_means(m: SemanticModel) -> List[ast.If]:
    """DataParallel's loss averaging: an ``if`` on the GPU count (``n_gpu``,
    ``args.n_gpu``, ``torch.cuda.device_count()``, ``world_size``) whose body only
    averages values over themselves (``if n_gpu > 1: loss = loss.mean()``). DataParallel
    gathers one loss per GPU; under DDP the loss is already a scalar and the ``if`` is
    dead code (with no ``else`` and not an ``elif``, it can simply go)."""
    got = m.cache.get("wraps:loss-means")
    if got is None:
        got = [
            node
            for node in m.nodes(ast.If)
            if node.body  # type: ignore[attr-defined]
            and all(_self_mean(s) for s in node.body)  # type: ignore[attr-defined]
            and any(GPU_COUNT.search(i) for i in _identifiers_in(node.test))  # type: ignore[attr-defined]
        ]
        m.cache["wraps:loss-means"] = got
    return got  # type: ignore[return-value]


def is_elif(m: SemanticModel, node: ast.If) -> bool:
    """``node`` is the ``elif`` of an ``if`` (not an ``if`` alone in an ``else`` block)."""
    parent = m.parent(node)
    return (
        isinstance(parent, ast.If)
        and len(parent.orelse) == 1
        and parent.orelse[0] is node
        and m.line_text(node.lineno)[m.position(node)[1]:].startswith("elif")
    )


@dataclass
class DpHelperCall:
    call: ast.Call  # in this script, with the wrapper as an argument
    name: str
    where: str  # ``modeling/sync_batchnorm/replicate.py:50``: its first DataParallel reference
    asserts: bool  # it asserts ``isinstance(<arg>, DataParallel)``: under DDP it can only fail


def dp_helper_calls(m: SemanticModel) -> List[DpHelperCall]:
    """Calls that pass the DataParallel wrapper to a function of a project module (a file
    beside the script) whose body names DataParallel: written for DataParallel, it will
    meet a DDP wrapper after the migration."""
    from dp2ddp.model.collectives import var_key, wrapped_vars

    got = m.cache.get("dp_helper_calls")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[DpHelperCall] = []
    keys = wrapped_vars(m, dp=True)
    for call, (pm, func, rel) in project_calls(m):
        if not isinstance(func, FUNCTIONS):
            continue
        args = list(call.args) + [k.value for k in call.keywords]
        if not any(var_key(m, a) in keys for a in args if not isinstance(a, ast.Starred)):
            continue
        refs = [r for r in pm.refs(DP) if pm.contains(func, r)]
        if not refs:
            continue
        asserts = any(
            isinstance(n, ast.Assert) and isinstance(n.test, ast.Call) and pm.is_name(n.test.func, {"builtins.isinstance"})
            and len(n.test.args) == 2 and pm.is_name(n.test.args[1], DP)
            for n in ast.walk(func)
        )
        out.append(DpHelperCall(call, func.name, f"{rel}:{refs[0].lineno}", asserts))  # type: ignore[attr-defined]
    m.cache["dp_helper_calls"] = out
    return out


def asserting_helper_statements(m: SemanticModel) -> Dict[int, "DpHelperCall"]:
    """``id(statement) -> call`` for statements that only call a project helper asserting a
    DataParallel (``patch_replication_callback(model)``): dp_idioms removes them (DDP126),
    so a hoisted wrap may move past them."""
    out = {}
    for h in dp_helper_calls(m):
        stmt = m.parent(h.call)
        if h.asserts and isinstance(stmt, ast.Expr) and stmt.value is h.call:
            out[id(stmt)] = h
    return out


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
    wrapper (``model = models.build(args)``), with whether that wrap needed a condition:
    ``[(call, guarded)]``."""
    got = m.cache.get("wraps:project_returns")
    if got is not None:
        return got  # type: ignore[return-value]
    out = []
    for call, (pm, func, _rel) in project_calls(m):
        if isinstance(func, ast.ClassDef):
            continue
        ws = returned_wraps(pm, func)
        if ws:
            out.append((call, any(w.conditions for w in ws)))
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


def uses_dataparallel(m: SemanticModel) -> bool:
    """The module names DataParallel in code (a wrap, a type test, another reference, or a
    spelling that may be it), not only in a docstring or comment: what a migration acts on."""
    return bool(dp_wraps(m) or dp_type_refs(m) or dp_other_refs(m) or unresolved_dp(m))
