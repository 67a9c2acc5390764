"""The project's own functions and classes a script calls: the model of the module beside
the script that defines one (read, never edited), and the script's calls of them."""

from __future__ import annotations

import ast
import os
from typing import Dict, List, Optional, Tuple

from dp2ddp.model.core import SemanticModel, build
from dp2ddp.model.module_files import NOT_PROJECT as _NOT_PROJECT, module_file

_PROJECT_MODELS: Dict[str, Optional["SemanticModel"]] = {}


def project_def(m: "SemanticModel", func: ast.AST) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    """What a call's function names in the project's own modules (a file beside the
    script, which the rewrite reads but never edits): the model of that module, its
    top-level ``def`` or ``class`` of that name (or a classmethod of such a class,
    ``ConfigParser.from_args``; or the method of an instance of such a class,
    ``Data_Loader(...).loader``), and the file's path relative to the script's folder.
    ``None`` for anything else."""
    if m.path in ("<string>", "<stdin>", "-"):
        return None
    base = os.path.dirname(os.path.abspath(m.path))
    for q in m.qualified_names(func):
        module, _, name = q.rpartition(".")
        got = _def_in(m, base, module, name, 0)
        if got is not None:
            return got
    for q in m.qualified_names(func):  # ``ConfigParser.from_args(...)``: a classmethod of a project class
        module, _, name = q.rpartition(".")
        module, _, cls_name = module.rpartition(".")
        got = _def_in(m, base, module, cls_name, 0) if module else None
        if got is not None and isinstance(got[1], ast.ClassDef):
            for stmt in got[1].body:
                if (isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == name
                        and any(isinstance(d, ast.Name) and d.id == "classmethod" for d in stmt.decorator_list)):
                    return got[0], stmt, got[2]
    return _instance_method(m, func) or _instance_call(m, func)


def project_defs(m: "SemanticModel", func: ast.AST) -> List[Tuple["SemanticModel", ast.AST, str]]:
    """:func:`project_def`, or, where the receiver of a method call holds objects of several
    project classes on different paths (``trainer = WATrainer(...) if args.tau else
    Trainer(...)``, then ``trainer.train(loader)``), the method of each, in the order the
    origins come (each once). Empty where any object it may hold is of the script's own class."""
    one = project_def(m, func)
    if one is not None or not isinstance(func, ast.Attribute) or m.path in ("<string>", "<stdin>", "-"):
        return [one] if one is not None else []
    from dp2ddp.model.flow import origins

    out: List[Tuple["SemanticModel", ast.AST, str]] = []
    for node, path in origins(m, func.value):
        got = class_of_call(m, node) if not path else None
        if got is None:
            continue
        if not got[2]:
            return []
        hit = method_of(got[0], got[1], func.attr, got[2])
        if hit is not None and all(hit[1] is not o[1] for o in out):
            out.append(hit)
    return out


_ACTIVE: set = set()  # instance methods being resolved (``x = x.method()`` must not recurse)
# what an instance method or call resolved to, kept while the outermost resolution runs: each
# receiver is followed once. Without it, ``x = x.m1(); x = x.m2(); ...`` (every binding of
# ``x`` an origin of every other) was explored in every order: n lines took n! steps
# (29 ``s = s.replace(...)`` lines of a text cleaner ran for minutes).
_RESOLVED: Dict[Tuple[str, int], Optional[Tuple["SemanticModel", ast.AST, str]]] = {}


def _once(kind: str, m: "SemanticModel", func: ast.AST, resolve) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    key = (kind, id(func))
    if key in _RESOLVED:
        return _RESOLVED[key]
    if id(func) in _ACTIVE:
        return None
    outermost = not _ACTIVE
    _ACTIVE.add(id(func))
    try:
        got = _RESOLVED[key] = resolve(m, func)
        return got
    finally:
        _ACTIVE.discard(id(func))
        if outermost:
            _RESOLVED.clear()


def _instance_method(m: "SemanticModel", func: ast.AST) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    """``loader = data.loader()`` where the values ``data`` may hold that are objects of a
    class are all of one project class (``data = Data_Loader(...)``, through names, ``self.x``
    and the script's own functions: :func:`dp2ddp.model.flow.origins`; other values, ``None``
    or a call of unknown make on another path, are no class of the script's): that class's
    method of that name (its own or a base class's: :func:`method_of`)."""
    if not isinstance(func, ast.Attribute):
        return None
    return _once("method", m, func, _resolve_instance_method)


def _resolve_instance_method(m: "SemanticModel", func: ast.Attribute) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    from dp2ddp.model.flow import origins

    classes = set()
    found = None
    for node, path in origins(m, func.value):
        got = class_of_call(m, node) if not path else None
        if got is None:
            continue  # not an object of a class of this project (None, a value of unknown make)
        if not got[2]:
            return None  # a class of the script itself: resolve_call's business
        classes.add((id(got[0]), id(got[1])))
        found = got
    if found is None or len(classes) != 1:
        return None
    pm, cls, rel = found
    return method_of(pm, cls, func.attr, rel)


def _instance_call(m: "SemanticModel", func: ast.AST) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    """``early_stopping(val_loss, model, path)`` where ``early_stopping`` holds an object of
    one project class (``EarlyStopping(patience=7)``) that defines ``__call__`` (its own or a
    base class's: :func:`method_of`): that method. A model class (``forward``, with
    ``nn.Module``'s ``__call__``) is not one."""
    if not isinstance(func, (ast.Name, ast.Attribute)):
        return None
    return _once("call", m, func, _resolve_instance_call)


def _resolve_instance_call(m: "SemanticModel", func: ast.AST) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    from dp2ddp.model.flow import origins

    found = None
    for node, path in origins(m, func):
        got = class_of_call(m, node) if not path else None
        if got is None or not got[2] or (found is not None and found[1] is not got[1]):
            return None  # a value of unknown make, the script's own class, or two classes
        found = got
    if found is None:
        return None
    pm, cls, rel = found
    return method_of(pm, cls, "__call__", rel)


def method_of(pm: "SemanticModel", cls: ast.ClassDef, name: str, rel: str = "",
              depth: int = 0) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    """``cls``'s method ``name`` (``cls`` a class of module ``pm``, at ``rel`` from the
    script's folder): its own, or one of its bases', in ``pm`` or in another project module
    (``class Saver(BaseSaver)`` with ``BaseSaver.save`` in ``lib/base.py``); as ``(module
    model, method, its module's path)``."""
    method = pm.methods(cls).get(name)
    if method is not None:
        return pm, method, rel
    if depth > 4:
        return None
    for b in cls.bases:
        if isinstance(b, ast.Name) and isinstance(pm.classes.get(b.id), ast.ClassDef) and pm.classes[b.id] is not cls:
            got = method_of(pm, pm.classes[b.id], name, rel, depth + 1)
        else:
            found = project_def(pm, b) if isinstance(b, (ast.Name, ast.Attribute)) else None
            got = (method_of(found[0], found[1], name, path_of(found, pm, rel), depth + 1)
                   if found is not None and isinstance(found[1], ast.ClassDef) else None)
        if got is not None:
            return got
    return None


def _def_in(m: "SemanticModel", base: str, module: str, name: str, depth: int) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    """``name``'s top-level ``def``/``class`` in project module ``module``, or in the module
    it re-exports it from (a package's ``from .logger import *`` / ``import Logger``)."""
    if not module or module.split(".")[0] in _NOT_PROJECT or depth > 4:
        return None
    found = _project_module(m, base, module)
    if found is None:
        return None
    pm, rel = found
    for stmt in pm.tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
            return pm, stmt, rel
    package = module if os.path.basename(pm.path) == "__init__.py" else module.rpartition(".")[0]
    for stmt in reversed(pm.tree.body):
        if not isinstance(stmt, ast.ImportFrom):
            continue
        alias = next((a for a in stmt.names if a.name == "*" or (a.asname or a.name) == name), None)
        if alias is None:
            continue
        if stmt.level:
            parts = package.split(".") if package else []
            if stmt.level - 1 > len(parts):
                continue
            target = ".".join(parts[: len(parts) - (stmt.level - 1)] + ([stmt.module] if stmt.module else []))
        else:
            target = stmt.module or ""
        got = _def_in(m, base, target, alias.name if alias.name != "*" else name, depth + 1)
        if got is not None:
            return got
    return None


def file_model(path: str) -> Optional["SemanticModel"]:
    """The model of the project file at ``path`` (read once, and again when edited since);
    ``None`` where it cannot be read or parsed."""
    try:
        st = os.stat(path)  # a file edited since is read again (the size too: two writes within a clock tick share an mtime)
        key = f"{os.path.realpath(path)}:{st.st_mtime_ns}:{st.st_size}"
    except OSError:
        return None
    if key not in _PROJECT_MODELS:
        try:
            with open(path, "rb") as fh:
                _PROJECT_MODELS[key] = build(fh.read(), path)
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
            _PROJECT_MODELS[key] = None
    return _PROJECT_MODELS[key]


def _project_module(m: "SemanticModel", base: str, module: str) -> Optional[Tuple["SemanticModel", str]]:
    """The model of project module ``module`` and its path relative to ``base``; looked up
    once per script model (files are found and read once per run, and read again when
    edited since)."""
    memo = m.cache.setdefault("_project_modules", {})  # module -> its file (the model is read fresh:
    if module not in memo:  # ``m`` may be a project module kept across runs while the file it imports changed)
        path = module_file(base, module)
        memo[module] = None if path is None or os.path.realpath(path) == os.path.realpath(m.path) else path  # type: ignore[index]
    path = memo[module]  # type: ignore[index]
    pm = file_model(path) if path is not None else None
    return (pm, os.path.relpath(path, base)) if pm is not None else None


def project_calls(m: "SemanticModel") -> List[Tuple[ast.Call, Tuple["SemanticModel", ast.AST, str]]]:
    """Every call of this script whose function is a top-level ``def`` or ``class`` of a
    project module, with :func:`project_def`'s answer; computed once per model."""
    got = m.cache.get("project_calls")
    if got is None:
        got = []
        for call in m.nodes(ast.Call):
            found = project_def(m, call.func)
            if found is not None:
                got.append((call, found))
        m.cache["project_calls"] = got
    return got  # type: ignore[return-value]


def class_of_call(m: "SemanticModel", call: ast.AST) -> Optional[Tuple["SemanticModel", ast.ClassDef, str]]:
    """The class a call constructs: one of the script's own (file ``""``), or one of a
    project module (its model, the class, its path relative to the script's folder);
    ``None`` for anything else, a node that is no call included."""
    if not isinstance(call, ast.Call):
        return None
    target = m.resolve_call(call)
    if target is not None:
        cls = m.parent(target)
        if (isinstance(cls, ast.ClassDef) and getattr(target, "name", None) == "__init__"
                and isinstance(call.func, ast.Name) and call.func.id == cls.name):
            return m, cls, ""
        return None
    if isinstance(call.func, ast.Name) and isinstance(m.classes.get(call.func.id), ast.ClassDef):
        return m, m.classes[call.func.id], ""  # a class of the script's own with no ``__init__`` of its own
    found = project_def(m, call.func) if isinstance(call.func, (ast.Name, ast.Attribute)) else None
    if found is None or not isinstance(found[1], ast.ClassDef):
        return None
    return found[0], found[1], found[2]


_ACROSS = 3  # project modules followed below the first


def reach_across(pm: "SemanticModel", node: ast.AST, rel: str) -> List[Tuple["SemanticModel", ast.AST, str]]:
    """The functions a call of ``node`` (a function of the project module ``pm``, or a class:
    its ``__init__``) runs, as ``(module model, function, module path relative to the
    script's folder)``: those of ``pm`` it reaches, and, up to three modules further, those
    of the project modules they call (``option.parse()`` -> ``util.mkdir_and_rename()``)."""
    out: List[Tuple["SemanticModel", ast.AST, str]] = []
    started: set = set()
    listed: set = set()
    todo = [(pm, node, rel, 0)]
    while todo:
        mod, fn, path, depth = todo.pop()
        if isinstance(fn, ast.ClassDef):  # its __init__: its own, or the one it inherits (from another module too)
            init = method_of(mod, fn, "__init__", path)
            if init is not None and init[0] is not mod and depth < _ACROSS:
                todo.append((init[0], init[1], init[2], depth + 1))
            fn = init[1] if init is not None and init[0] is mod else None
        if fn is None or (id(mod), id(fn)) in started:
            continue
        started.add((id(mod), id(fn)))
        reached = mod.reach(fn)
        for f in reached:
            if (id(mod), id(f)) not in listed:
                listed.add((id(mod), id(f)))
                out.append((mod, f, path))
        if depth >= _ACROSS:
            continue
        for call, (mod2, node2, rel2) in project_calls(mod):
            if any(mod.contains(f, call) for f in reached):
                todo.append((mod2, node2, os.path.normpath(os.path.join(os.path.dirname(path), rel2)), depth + 1))
        for f in reached:  # ``super().__init__(...)`` of a class whose base lies in another project module
            for call in mod.calls_in(f):
                base = _super_target(mod, call)
                if base is not None:
                    todo.append((base[0], base[1], path_of(base, mod, path), depth + 1))
    return out


def _foreign_base(mod: "SemanticModel", cls: ast.ClassDef) -> Optional[Tuple["SemanticModel", ast.ClassDef, str]]:
    """The class of another project module that ``cls`` (or the class of its own module it
    derives from) derives from: ``class Child(base.Options)``, whose ``super().m()`` runs there."""
    seen = set()
    cur: Optional[ast.ClassDef] = cls
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        for b in cur.bases:
            found = project_def(mod, b) if isinstance(b, (ast.Name, ast.Attribute)) else None
            if found is not None and isinstance(found[1], ast.ClassDef):
                return found  # type: ignore[return-value]
        cur = next((mod.classes[b.id] for b in cur.bases if isinstance(b, ast.Name) and b.id in mod.classes
                    and mod.classes[b.id] is not cur), None)
    return None


def _super_target(mod: "SemanticModel", call: ast.Call) -> Optional[Tuple["SemanticModel", ast.AST, str]]:
    """What ``super().name(...)`` runs where the enclosing class's base is a class of another
    project module: that class (for ``__init__``: :func:`reach_across` finds its constructor)
    or its method ``name``; ``None`` otherwise (a base of this module: ``resolve_call``)."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Call) and isinstance(f.value.func, ast.Name)
            and f.value.func.id == "super") or mod.resolve_call(call) is not None:
        return None
    cls = mod.enclosing_class(call)
    base = _foreign_base(mod, cls) if cls is not None else None
    if base is None:
        return None
    if f.attr == "__init__":
        return base
    method = base[0].method_of(base[1], f.attr)
    return (base[0], method, base[2]) if method is not None else None


def path_of(found: Tuple["SemanticModel", ast.AST, str], pm: "SemanticModel", rel: str) -> str:
    """Where ``found`` (what :func:`project_def` answered, asked from module ``pm``, which lies
    at ``rel`` from the script's folder) lies, from the script's folder: ``rel`` for ``pm``'s
    own definitions, else its path from ``pm``'s folder joined to that folder."""
    return rel if found[0] is pm else os.path.normpath(os.path.join(os.path.dirname(rel), found[2]))


def factory_classes(pm: "SemanticModel", value: ast.AST, rel: str) -> List[Tuple["SemanticModel", ast.AST, str]]:
    """What a factory of module ``pm`` (at ``rel``) returns with ``return __factory[name](*args,
    **kwargs)``: every class its module's own dict literal names (``{'Binomial':
    BinomialLoss, ...}``), since the name picked is the configuration's: what the caller
    gets is any of them."""
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Subscript) and isinstance(value.func.value, ast.Name)):
        return []
    _, bindings = pm.lookup(value.func.value.id, pm.scope_of(value))
    if len(bindings) != 1 or not isinstance(bindings[0].value, ast.Dict):
        return []
    out: List[Tuple["SemanticModel", ast.AST, str]] = []
    for v in bindings[0].value.values:
        found = project_def(pm, v) if isinstance(v, (ast.Name, ast.Attribute)) else None
        if found is not None and isinstance(found[1], ast.ClassDef):
            out.append((found[0], found[1], path_of(found, pm, rel)))
        elif isinstance(v, ast.Name):
            _, own = pm.lookup(v.id, pm.scope_of(v))
            out.extend((pm, b.node, rel) for b in own if isinstance(b.node, ast.ClassDef))
    return out


def returned_callables(pm: "SemanticModel", func: ast.AST, rel: str) -> List[Tuple["SemanticModel", ast.AST, str]]:
    """What a project function ``func`` (of module ``pm`` at ``rel``) returns to be called:
    the classes it makes by a name its module's dict gives them (:func:`factory_classes`),
    and the methods of its own object or functions of its module it returns by name
    (DeepLab's ``SegmentationLosses(...).build_loss(mode)``: ``return self.CrossEntropyLoss``
    on one branch, ``return self.FocalLoss`` on another)."""
    out: List[Tuple["SemanticModel", ast.AST, str]] = []
    cls = pm.enclosing_class(func)
    methods = pm.methods(cls) if cls is not None else {}
    for ret in (n for n in ast.walk(func) if isinstance(n, ast.Return) and n.value is not None):
        v = ret.value
        out.extend(factory_classes(pm, v, rel))
        if (isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self"
                and isinstance(methods.get(v.attr), (ast.FunctionDef, ast.AsyncFunctionDef))):
            out.append((pm, methods[v.attr], rel))
        elif isinstance(v, ast.Name) and pm.enclosing_function(ret) is func:
            _, bindings = pm.lookup(v.id, pm.scope_of(v))
            if bindings and all(b.kind == "def" for b in bindings):
                out.extend((pm, b.node, rel) for b in bindings)
    return out
