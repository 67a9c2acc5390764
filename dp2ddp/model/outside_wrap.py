"""Modules that train outside the DataParallel wrap.

Under DataParallel one process holds one copy of every module: a module the script trains
beside the wrapped model (a center loss's ``nn.Parameter`` centres stepped by their own
optimizer, a discriminator left unwrapped) or updates from the batch (a memory bank's
buffer, written row by row from each sample's features) sees the whole batch. Under
DistributedDataParallel each rank holds its own copy of it, and only the wrapped module's
gradients are averaged (and only its buffers broadcast): each rank would train or update
its copy from its own share, and the copies drift apart.

* :func:`trained_outside_wrap`: such modules, each with the place that trains it (the
  optimizer built over its parameters, or the in-place update of its buffer).

A module is *inside* the wrap where its name is the wrap's target or argument, a part of
them (``model.module.head``), passed to the constructor that made the wrapped module
(``DataParallel(Net(head))``, or ``net = Net(head)`` then ``DataParallel(net)``), or
assigned onto one (``net.head = head``). Only modules made here by a constructor of an
``nn.Module`` class (``torch.nn``'s, this module's or a project module's) are judged; a
value dp2ddp cannot follow is not.
"""

from __future__ import annotations

import ast
from typing import Iterable, List, NamedTuple, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.stores import container_mutations
from dp2ddp.model.handles import expr_handle
from dp2ddp.model.held_parameters import held_modules
from dp2ddp.model.kinds import is_module_class
from dp2ddp.model.project_defs import class_of_call
from dp2ddp.model.steps import binding_values, kind_of_value
from dp2ddp.model.syntax import root_name, unplaced
from dp2ddp.model.wraps import dp_wraps

_NOT_TRAINED = frozenset({"DataParallel", "DistributedDataParallel"})
_PARAMETERS = frozenset({"parameters", "named_parameters"})


class Unsynced(NamedTuple):
    """A module that trains outside the wrap."""

    module: ast.AST  # the expression that holds it (``closs``, ``self.bank``)
    made: ast.Call  # the constructor call that made it
    cls: str  # the class's name
    where: ast.AST  # the optimizer over its parameters, or the update of its buffer
    what: str  # "parameters" or "buffer <name>"
    place: str  # where ``where`` is: "line N", or "path:N" in a project module


def trained_outside_wrap(m: SemanticModel) -> List[Unsynced]:
    got = m.cache.get("outside_wrap")
    if got is None:
        got = m.cache["outside_wrap"] = _find(m)
    return got  # type: ignore[return-value]


def _find(m: SemanticModel) -> List[Unsynced]:
    wraps = [w for w in dp_wraps(m) if not w.functional and w.problem is None]
    if not wraps:
        return []
    inside = _inside(m, wraps)
    out: List[Unsynced] = []
    seen: Set[str] = set()
    for opt, module in _optimized_modules(m):
        text = m.source(module)
        if text in seen or (_covered(text, inside) and not isinstance(module, ast.Call)):
            continue  # (a module made where it is handed over is an object of its own)
        made = _made(m, module) if not isinstance(module, ast.Call) else _made_here(m, module)
        if made is None:
            continue
        seen.add(text)
        out.append(Unsynced(module, made[0], made[1], opt, "parameters", f"line {opt.lineno}"))
    for module, made, cls_name, update, buffer, place in _updated_buffers(m):
        text = m.source(module)
        if text in seen or _covered(text, inside):
            continue
        seen.add(text)
        out.append(Unsynced(module, made, cls_name, update, f"buffer {buffer}", place))
    return out


# ----------------------------------------------------------------------------- the wrap


def _names_in(node: Optional[ast.AST]) -> Iterable[ast.AST]:
    if node is None:
        return []
    return [n for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))]


def _inside(m: SemanticModel, wraps) -> Set[str]:
    """Source texts of what the wraps hold (see the module docstring)."""
    inside: Set[str] = set()
    todo: List[ast.AST] = []
    for w in wraps:
        for n in [w.target, *_names_in(w.module)]:
            if n is not None:
                todo.append(n)
    depth = 0
    while todo and depth < 4:  # names in what made them, a few constructors deep
        depth += 1
        nxt: List[ast.AST] = []
        for n in todo:
            text = m.source(n)
            if text in inside:
                continue
            inside.add(text)
            for v in binding_values(m, n) or []:
                nxt.extend(_names_in(v) if isinstance(v, ast.Call) else [])
        todo = nxt
    # ``net.head = head`` onto a module already inside
    for a in m.nodes(ast.Assign):
        for t in a.targets:
            if isinstance(t, ast.Attribute) and _covered(m.source(t.value), inside):
                inside.update(m.source(n) for n in _names_in(a.value))
    return inside


def _covered(text: str, inside: Set[str]) -> bool:
    return any(text == t or text.startswith(t + ".") for t in inside)


# ----------------------------------------------------------------------------- modules


def _module_class(m: SemanticModel, call: ast.Call) -> Optional[str]:
    """The class name when ``call`` constructs an ``nn.Module`` (not a DataParallel)."""
    for q in m.qualified_names(call.func):
        name = q.rsplit(".", 1)[-1]
        if q.startswith("torch.nn.") and q.count(".") == 2 and name[:1].isupper() and name not in _NOT_TRAINED:
            return name
    cls = class_of_call(m, call)
    if cls is not None and is_module_class(cls[0], cls[1]):
        from dp2ddp.model.kinds import wraps_all_it_holds

        if any(cls[0].contains(cls[1], w.call) and wraps_all_it_holds(cls[0], w.target, w.call) for w in dp_wraps(cls[0])):
            return None  # ``self.encoder = DP(self.encoder)`` and nothing else that trains: inside its own wrap
        return cls[1].name
    return None


def _made(m: SemanticModel, module: ast.AST) -> Optional[Tuple[ast.Call, str]]:
    """The constructor call that made ``module`` and its class, when every binding is one
    (or, through the script's functions, every value that reaches it: ``loss_fn, center =
    make_loss(...)`` where ``make_loss`` returns the ``CenterLoss(...)`` it made)."""
    values = binding_values(m, module)
    if not values or not all(isinstance(v, ast.Call) and not _unpacked_from(v, m.parent(v)) for v in values):
        from dp2ddp.model.flow import origins

        found = origins(m, module)
        values = [node for node, path in found if not path] if found and all(not path for _, path in found) else []
    if not values:
        return None
    found = []
    for v in map(unplaced, values):  # ``CenterLoss(...).cuda()``
        if not isinstance(v, ast.Call):
            return None
        cls = _module_class(m, v)
        if cls is None:
            return None
        found.append((v, cls))
    return found[0]


def _made_here(m: SemanticModel, call: ast.Call) -> Optional[Tuple[ast.Call, str]]:
    """A module made where it is handed over (``CriticBaseline(CriticNetwork(...))``, or
    ``(A(...) if lstm else B(...)).to(device)``: the first of the choices)."""
    made = unplaced(call)
    for choice in ([made.body, made.orelse] if isinstance(made, ast.IfExp) else [made]):
        cls = _module_class(m, choice) if isinstance(choice, ast.Call) else None
        if cls is not None:
            return choice, cls
    return None


def _unpacked_from(value: ast.AST, parent: Optional[ast.AST]) -> bool:
    """``a, b = value``: the binding's value is the whole call, not what it gives ``b``."""
    return isinstance(parent, ast.Assign) and any(isinstance(t, (ast.Tuple, ast.List)) for t in parent.targets)


# ----------------------------------------------------------------------------- parameters


def _optimized_modules(m: SemanticModel) -> List[Tuple[ast.Call, ast.AST]]:
    """(optimizer call, module) for every ``module.parameters()`` an optimizer that some
    code steps is built over (through a name bound to a list of them too)."""
    out = []
    for call in m.nodes(ast.Call):
        if kind_of_value(m, call) != "optimizer" or not _stepped(m, call):
            continue
        parts: List[ast.AST] = [*call.args, *(k.value for k in call.keywords)]
        for a in list(parts):
            if isinstance(a, (ast.Name, ast.Attribute)):
                parts.extend(binding_values(m, a) or [])
                # and what is put into it later (``param_groups.append({'params': criterion.parameters()})``)
                h = expr_handle(m, a)
                parts.extend(container_mutations(m).get(h, []) if h is not None else [])
        for part in parts:
            for n in ast.walk(part):
                if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _PARAMETERS
                        and isinstance(n.func.value, (ast.Name, ast.Attribute))):
                    out.append((call, n.func.value))
                else:  # ``baseline.get_learnable_parameters()``: a module the object holds
                    out.extend((call, held) for held in held_modules(m, n))
    return out


def _stepped(m: SemanticModel, call: ast.Call) -> bool:
    parent = m.parent(call)
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1):
        return False
    text = m.source(parent.targets[0])
    for c in m.calls_spelled("step"):
        f = c.func
        if isinstance(f, ast.Attribute) and (m.source(f.value) == text or any(m.source(a) == text for a in c.args)):
            return True
    # handed to the code that trains (``train_epoch(model, optimizer, ...)`` of a project module)
    return any(m.source(a) == text for c in m.nodes(ast.Call) if m.resolve_call(c) is None
               for a in [*c.args, *(k.value for k in c.keywords)])


# ----------------------------------------------------------------------------- buffers


def _updated_buffers(m: SemanticModel):
    """(module, constructor call, class name, update, buffer, place) for every instance, called in
    code that trains, of a class of this project whose methods change one of its buffers
    in place (``self.memory[idx] = ...``, ``self.memory.index_copy_(...)``, or the buffer
    handed to an autograd ``Function``'s ``apply``, which may)."""
    from dp2ddp.model.loss_calls import trains_here

    out = []
    for a in m.nodes(ast.Assign):
        if len(a.targets) != 1 or not isinstance(a.targets[0], (ast.Name, ast.Attribute)) or not isinstance(a.value, ast.Call):
            continue
        cls = class_of_call(m, a.value)
        if cls is None or not is_module_class(cls[0], cls[1]):
            continue
        changed = _changed_buffer(cls[0], cls[1])
        if changed is None:
            continue
        text = m.source(a.targets[0])
        if any(isinstance(c.func, (ast.Name, ast.Attribute)) and m.source(c.func) == text and trains_here(m, c)
               for c in m.nodes(ast.Call)):
            line = changed[0].lineno  # type: ignore[attr-defined]
            out.append((a.targets[0], a.value, cls[1].name, changed[0], changed[1], f"{cls[2]}:{line}" if cls[2] else f"line {line}"))
    return out


def _changed_buffer(cm: SemanticModel, cls: ast.ClassDef) -> Optional[Tuple[ast.AST, str]]:
    buffers = set()
    for n in ast.walk(cls):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "register_buffer"
                and n.args and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)):
            buffers.add(n.args[0].value)
    if not buffers:
        return None

    def own(e: ast.AST) -> Optional[str]:
        while isinstance(e, ast.Subscript):
            e = e.value
        if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self" and e.attr in buffers:
            return e.attr
        return None

    for n in ast.walk(cls):
        if isinstance(n, (ast.Assign, ast.AugAssign)):
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                name = own(t)
                func = cm.enclosing_function(n)
                if name is not None and (isinstance(t, ast.Subscript) or isinstance(n, ast.AugAssign)
                                         or getattr(func, "name", "") != "__init__"):
                    return n, name
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            name = own(n.func.value)
            if name is not None and n.func.attr.endswith("_") and not n.func.attr.startswith("_") and n.func.attr != "requires_grad_":
                return n, name
            if n.func.attr == "apply" and root_name(n.func) is not None:
                for arg in n.args:
                    name = own(arg)
                    if name is not None and not isinstance(arg, ast.Subscript):
                        return n, name
    return None
