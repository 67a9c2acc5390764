"""A script's own distributed path: what it already has for DDP beside a DataParallel
fallback (HF's ``--local_rank``, imagenet's ``mp.spawn``/``--dist-url``, yolov5's
``LOCAL_RANK``). The facts the mixed-script migration (:mod:`dp2ddp.codemods.mixed`) asks:

* :func:`init_source`: where an argument of ``init_process_group`` comes from (the
  environment, a literal, an option of the parsed arguments, a parameter of a spawned
  worker, a name the script assigns), read from :func:`init_arguments`;
* :func:`namespace_origin`: the statement that makes the parsed arguments an option is read
  from (``args = parser.parse_args()``), followed through assignments, ``global`` and the
  parameters of the functions they are passed to; :func:`option_stores`: the assignments
  to some of its options; :func:`parsed_namespaces`: the names that hold parsed arguments;
* :func:`activation_tests`: the ``if`` tests on the way to a node (the init), through the
  calls of its function; :func:`spawn_flags`: the options whose truth starts ``mp.spawn``;
* :func:`env_decided`: the spellings whose value torchrun's environment decides;
  :func:`rank_env_reads`: the environment reads that name a rank; :func:`switch_tests`:
  the tests that switch the path on, wherever the script repeats them;
* :func:`wrap_assignments`: where the script's own wraps are assigned, and the ``if`` chain
  around them; :func:`master_env_stores`: the rendezvous address it sets itself.

Where the script reads its local rank (``--local_rank``) is :mod:`dp2ddp.model.ranks`; its
``mp.spawn`` calls are :mod:`dp2ddp.model.launch`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

from dp2ddp.model.collectives import assigned_keys
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.launch import spawn_argument, spawns_of
from dp2ddp.model.ranks import env_read, local_rank_arguments, local_rank_dest
from dp2ddp.model.syntax import FUNCTIONS, is_main_test

# torch.distributed.init_process_group's parameters (every version dp2ddp supports)
_INIT = ("def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,"
         " group_name='', pg_options=None, device_id=None, _ranks=None): ...\n")


@lru_cache(maxsize=None)
def _init_def():
    import libcst as cst

    return cst.ensure_type(cst.parse_statement(_INIT), cst.FunctionDef)


def init_arguments(m: SemanticModel, call: ast.Call) -> Optional[Dict[str, ast.AST]]:
    """The expressions an ``init_process_group`` call passes, by parameter, bound as Python
    binds them (:func:`dp2ddp.model.signatures.bind`, on the call's LibCST parse: imported
    here, so that the model stays importable without LibCST); parameters left to their
    default are absent. ``None`` where the call does not bind (``*args``/``**kwargs``, a call
    Python would reject)."""
    memo = m.cache.setdefault("own_path:init_arguments", {})
    if call not in memo:  # type: ignore[operator]
        import libcst as cst

        from dp2ddp.model.signatures import BindError, bind

        parsed = cst.ensure_type(cst.parse_expression(m.source(call)), cst.Call)
        positional, keywords = iter(call.args), iter(call.keywords)
        # LibCST keeps the arguments in source order; ast splits them into args and keywords
        back = {id(a.value): next(keywords).value if a.keyword is not None or a.star == "**" else next(positional)
                for a in parsed.args}
        try:
            bound = bind(parsed, _init_def())
        except BindError:
            memo[call] = None  # type: ignore[index]
        else:
            memo[call] = {k: back[id(v)] for k, v in bound.items() if id(v) in back}  # type: ignore[index]
    return memo[call]  # type: ignore[index]


@dataclass
class InitSource:
    """Where an argument of ``init_process_group`` comes from. ``kind``:

    * ``"environment"``: it reads the environment already (``os.environ[...]``, ``"env://"``);
    * ``"address"``: a literal ``init_method`` other than ``env://`` (``"tcp://..."``);
    * ``"literal"``: another literal (``world_size=2``);
    * ``"option"``: an option of parsed arguments (``args.world_size``), ``origin`` the
      statement that makes them (:func:`namespace_origin`);
    * ``"worker"``: a parameter of a function ``mp.spawn`` starts;
    * ``"assigned"``: a name each of whose bindings is a one-target assignment (``assigns``);
    * ``"computed"``: anything else.
    """

    kind: str
    node: ast.AST
    origin: Optional[ast.stmt] = None
    assigns: Tuple[ast.Assign, ...] = ()


def init_source(m: SemanticModel, init: ast.Call, name: str) -> Optional[InitSource]:
    """Where ``init``'s argument ``name`` comes from; ``None`` where it passes none."""
    value = (init_arguments(m, init) or {}).get(name)
    if value is None:
        return None
    if env_read(m, value):
        return InitSource("environment", value)
    if isinstance(value, ast.Constant):
        if name == "init_method" and value.value == "env://":
            return InitSource("environment", value)
        return InitSource("address" if name == "init_method" and isinstance(value.value, str) else "literal", value)
    origin = namespace_origin(m, value)
    if origin is not None:
        return InitSource("option", value, origin=origin)
    if not isinstance(value, ast.Name):
        return InitSource("computed", value)
    func = m.enclosing_function(init)
    if func is not None and value.id in m.params(func) and spawns_of(m, func):
        return InitSource("worker", value)
    where, bindings = m.lookup(value.id, m.scope_of(value))
    assigns = [b.node for b in bindings if b.kind == "assign" and isinstance(b.node, ast.Assign) and len(b.node.targets) == 1]
    if where is not None and assigns and len(assigns) == len(bindings):
        return InitSource("assigned", value, assigns=tuple(assigns))
    return InitSource("computed", value)


# --------------------------------------------------------------------------- parsed arguments


def _origin(m: SemanticModel, name: ast.AST, depth: int = 0) -> Optional[ast.stmt]:
    """The statement that creates the object ``name`` holds (``args = parser.parse_args()``,
    ``args = get_parser()``), followed through plain assignments, ``global``, and the
    parameters of functions it is passed to (also by ``mp.spawn(fn, args=(..., args))``)."""
    if not isinstance(name, ast.Name) or depth > 5:
        return None
    where, bindings = m.lookup(name.id, m.scope_of(name))
    if where is None or not bindings:
        return None
    found = set()
    for b in bindings:
        if b.kind in ("assign", "unpack") and isinstance(b.node, ast.Assign):
            v = b.node.value
            if isinstance(v, ast.Call) or (isinstance(v, ast.Subscript) and isinstance(v.value, ast.Call)):
                found.add(b.node)
            elif isinstance(v, ast.Name) and b.kind == "assign":
                found.add(_origin(m, v, depth + 1))
            else:
                return None
        elif b.kind == "param" and where.kind == "function":
            func = where.node
            args = [m.argument_for(func, c, b.name) for c in m.call_sites(func)]
            for sp in spawns_of(m, func):
                if isinstance(sp.args, ast.Tuple):
                    args.append(spawn_argument(m, sp, b.name))
            if not args:
                return None
            for a in args:
                found.add(_origin(m, a, depth + 1) if a is not None else None)
        else:
            return None
    return found.pop() if len(found) == 1 and None not in found else None


def namespace_origin(m: SemanticModel, attr: ast.AST) -> Optional[ast.stmt]:
    """For ``args.world_size``: the statement that makes ``args``, when it is one statement
    that can be followed (see :func:`_origin`)."""
    if isinstance(attr, ast.Attribute) and isinstance(attr.value, ast.Name):
        return _origin(m, attr.value)
    return None


def option_stores(m: SemanticModel, origin: ast.stmt, attrs: Iterable[str]) -> List[Tuple[ast.Assign, str]]:
    """``args.world_size = ...``: the one-target assignments to an option in ``attrs`` of the
    arguments ``origin`` makes, with the option, in source order."""
    attrs = set(attrs)
    out = []
    for a in m.nodes(ast.Assign):
        t = a.targets[0] if len(a.targets) == 1 else None
        if isinstance(t, ast.Attribute) and t.attr in attrs and namespace_origin(m, t) is origin:
            out.append((a, t.attr))
    return out


def parsed_namespaces(m: SemanticModel) -> Set[str]:
    """The names assigned ``parser.parse_args()`` / ``parse_known_args()`` (its first item);
    ``{"args"}`` where none is."""
    out = set()
    for call in m.nodes(ast.Call):
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr in ("parse_args", "parse_known_args"):
            stmt = m.statement_of(call)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                t = stmt.targets[0]
                if isinstance(t, ast.Tuple) and t.elts:
                    t = t.elts[0]
                if isinstance(t, ast.Name):
                    out.add(t.id)
    return out or {"args"}


# --------------------------------------------------------------------------- what switches the path on


def _ifs_around(m: SemanticModel, node: ast.AST) -> Iterator[Tuple[ast.AST, str]]:
    """``(test, "body"|"orelse")`` of the ifs around ``node`` in its function, not the main
    guard (``Structure.branches``, which stops at a lambda: the ifs around a lambda lead to
    its body too)."""
    cur: Optional[ast.AST] = node
    while cur is not None:
        for a, where in m.branches(cur):
            if isinstance(a, ast.If) and where in ("body", "orelse") and not is_main_test(a.test):
                yield a.test, where
        cur = next((a for a in m.ancestors(cur) if isinstance(a, FUNCTIONS + (ast.Module, ast.Lambda, ast.ClassDef))), None)
        cur = cur if isinstance(cur, ast.Lambda) else None


def activation_tests(m: SemanticModel, node: ast.AST, depth: int = 0, seen=None) -> Iterator[Tuple[ast.AST, str]]:
    """``(test, "body"|"orelse")``: the branches that lead to ``node``, the ifs around it in
    its function and, a few levels up, around the one call of that function (BasicSR: ``if
    args.launcher == 'none': ... else: init_dist(...)``) or the ``mp.spawn`` that starts it."""
    seen = set() if seen is None else seen
    yield from _ifs_around(m, node)
    func = m.enclosing_function(node)
    if func is None or depth >= 3 or func in seen:
        return
    seen.add(func)
    sites = [sp.call for sp in spawns_of(m, func)] or m.call_sites(func)
    if len(sites) == 1:
        yield from activation_tests(m, sites[0], depth + 1, seen)


def spawn_flags(m: SemanticModel, spawn: ast.Call) -> List[ast.Attribute]:
    """``if args.multiprocessing_distributed: mp.spawn(...)``: the options (``name.attr``)
    whose truth the spawn needs, innermost first."""
    return [a.test for a, where in m.branches(spawn)
            if isinstance(a, ast.If) and where == "body" and isinstance(a.test, ast.Attribute) and isinstance(a.test.value, ast.Name)]


def spellings(m: SemanticModel, expr: ast.AST) -> Set[str]:
    """The source text of every name and attribute in ``expr`` (``args.local_rank``, ``args``)."""
    return {m.source(n) for n in ast.walk(expr) if isinstance(n, (ast.Name, ast.Attribute))}


def env_decided(m: SemanticModel, adapted: Dict[ast.stmt, Set[str]]) -> Set[str]:
    """Spellings whose value torchrun's environment decides: ``--local_rank`` options, the
    ``adapted`` options (those set from the environment, by the statement that makes their
    arguments), names assigned from environment reads, and (to a fixpoint) names assigned
    from those; a spelling only if every assignment of it is so."""
    out = set()
    for call, _flag, _env in local_rank_arguments(m):
        out.update(f"{ns}.{local_rank_dest(call)}" for ns in parsed_namespaces(m))
    for origin, attrs in adapted.items():
        for node in m.nodes(ast.Attribute):
            if node.attr in attrs and namespace_origin(m, node) is origin:
                out.add(m.source(node))
    assigns: dict = {}
    for a in m.nodes(ast.Assign):
        if len(a.targets) == 1 and isinstance(a.targets[0], (ast.Name, ast.Attribute)):
            assigns.setdefault(m.source(a.targets[0]), []).append(a.value)
    base = set(out)
    changed = True
    while changed:
        changed = False
        for t, values in assigns.items():
            if t in out:
                continue
            if any(env_read(m, v) or spellings(m, v) & out for v in values):
                out.add(t)
                changed = True
    # (``args.distributed = False`` under a config test switches the path off again)
    changed = True
    while changed:
        changed = False
        for t in list(out - base):
            if any(not (env_read(m, v) or spellings(m, v) & out) for v in assigns.get(t, [])):
                out.discard(t)
                changed = True
    return out


def rank_env_reads(m: SemanticModel) -> List[ast.AST]:
    """Environment reads that name a rank (``os.environ["LOCAL_RANK"]``, ``os.getenv("RANK")``)."""
    return [n for n in m.nodes(ast.Subscript, ast.Call) if env_read(m, n) and "RANK" in m.source(n).upper()]


# --------------------------------------------------------------------------- its own wraps and settings


def switch_tests(m: SemanticModel, predicates: List[Tuple[ast.AST, str]]) -> List[Tuple[ast.AST, str]]:
    """The tests of ``if``/``while``/conditional expressions that are one of ``predicates``
    (``(test, branch)``: a test that switches the path on in that branch) or spelled the same
    (``if args.distributed:`` around the sampler too), with the branch of that predicate (of
    the first predicate spelled so, for another test), in source order."""
    if not predicates:
        return []
    exact = {id(t): b for t, b in predicates}
    dumps: Dict[str, str] = {}
    for test, branch in predicates:
        dumps.setdefault(ast.dump(test), branch)
    out = []
    for node in m.nodes(*{type(t) for t, _ in predicates}):
        branch = exact.get(id(node), dumps.get(ast.dump(node)))
        parent = m.parent(node)
        if branch is not None and isinstance(parent, (ast.If, ast.IfExp, ast.While)) and parent.test is node:
            out.append((node, branch))
    return out


def wrap_assignments(m: SemanticModel, wrap: ast.Call) -> List[Tuple[ast.Assign, Optional[ast.If]]]:
    """Where a wrap the script makes is assigned: its one-target assignment, with the
    outermost ``if`` of the chain around it (up to a loop, ``with``, ``try`` or function;
    ``None`` where none is). A wrap a helper returns (yolov5's ``smart_DDP(model)``) is
    assigned where the helper is called, at each of its call sites."""
    parent = m.parent(wrap)
    if isinstance(parent, ast.Return):
        func = m.enclosing_function(wrap)
        return [x for site in (m.call_sites(func) if func is not None else []) for x in wrap_assignments(m, site)]
    if not assigned_keys(m, wrap) or not isinstance(parent, ast.Assign) or len(parent.targets) != 1:
        return []
    top = None
    for a in m.ancestors(m.statement_of(wrap)):  # type: ignore[arg-type]
        if isinstance(a, FUNCTIONS + (ast.Module, ast.ClassDef, ast.For, ast.While, ast.With, ast.Try)):
            break
        if isinstance(a, ast.If):
            top = a
    return [(parent, top)]


def master_env_stores(m: SemanticModel) -> List[ast.Assign]:
    """``os.environ["MASTER_ADDR"] = ...`` / ``["MASTER_PORT"]``: the rendezvous address
    the script sets itself (torchrun sets it too)."""
    out = []
    for a in m.nodes(ast.Assign):
        t = a.targets[0] if len(a.targets) == 1 else None
        if (isinstance(t, ast.Subscript) and m.is_name(t.value, {"os.environ"}) and isinstance(t.slice, ast.Constant)
                and t.slice.value in ("MASTER_ADDR", "MASTER_PORT")):
            out.append(a)
    return out
