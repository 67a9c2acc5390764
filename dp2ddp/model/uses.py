"""Where a wrapped model is used, and which uses need the bare module.

A DDP (or DataParallel) wrapper has the ``nn.Module`` API — ``parameters()``,
``train()``, ``state_dict()``, ``zero_grad()`` ... — and its forward; it does not have
the model's own attributes and methods (``model.num_classes``, ``model.predict(x)``,
``model.freeze_backbone()``): those are on ``.module``.

:func:`wrapper_keys` follows a wrapper from the variable it is assigned to, through the
return value of the function that builds it and into the parameters of the functions of
the script it is passed to. :func:`wrapper_uses` classifies each use.
:func:`requires_grad_changes` finds where parameters are frozen or unfrozen,
:func:`sets_true` what a change sets and :func:`changed_owner` whose parameters it touches.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Set

from dp2ddp.model.collectives import VarKey, assigned_keys, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.call_args import REQUIRES_GRAD_PARAMS, argument
from dp2ddp.model.syntax import FUNCTIONS, root_name

# the nn.Module API DDP and DataParallel share with the module they wrap
MODULE_API = frozenset(
    {
        "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
        "named_modules", "train", "eval", "zero_grad", "to", "cuda", "cpu", "float", "double", "half", "bfloat16",
        "type", "apply", "requires_grad_", "register_forward_hook", "register_forward_pre_hook",
        "register_full_backward_hook", "register_backward_hook", "register_full_backward_pre_hook", "state_dict",
        "load_state_dict", "no_sync", "module", "forward", "training", "get_submodule", "get_parameter", "get_buffer",
        "share_memory", "extra_repr", "add_module", "register_module", "register_buffer", "register_parameter",
        "named_modules", "__class__", "__dict__", "to_empty", "ipu", "xpu", "mtia", "compile",
    }
)
STATE_DICT = frozenset({"state_dict", "load_state_dict"})


@dataclass
class Use:
    node: ast.AST  # the Name / self.x Attribute that names the wrapper
    kind: str  # forward | api | state_dict | module | attribute | store | passed | other
    attr: Optional[str] = None
    function: Optional[ast.AST] = None  # for `passed`: the function of this script it is passed to


def _returned_locals(m: SemanticModel, func: ast.AST) -> Dict[str, Set[Optional[int]]]:
    """Locals ``func`` returns: name -> positions (``None``: the whole value; ``i``: item
    ``i`` of a returned tuple)."""
    out: Dict[str, Set[Optional[int]]] = {}
    for node in ast.walk(func):
        if not isinstance(node, ast.Return) or node.value is None or m.enclosing_function(node) is not func:
            continue
        if isinstance(node.value, ast.Name):
            out.setdefault(node.value.id, set()).add(None)
        elif isinstance(node.value, ast.Tuple):
            for i, el in enumerate(node.value.elts):
                if isinstance(el, ast.Name):
                    out.setdefault(el.id, set()).add(i)
    return out


def _call_targets(m: SemanticModel, call: ast.Call, index: Optional[int]) -> List[VarKey]:
    parent = m.parent(call)
    if index is None:
        return assigned_keys(m, call)
    if isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1:
        t = parent.targets[0]
        if isinstance(t, (ast.Tuple, ast.List)) and index < len(t.elts):
            k = var_key(m, t.elts[index])
            return [k] if k is not None else []
    return []


def wrapper_keys(m: SemanticModel, seeds: Iterable[VarKey], max_depth: int = 3) -> Set[VarKey]:
    """The variables that hold the wrapper: ``seeds``, call-site targets of a function that
    returns one of them (also as an item of a returned tuple), and parameters of functions
    of this script whose every call passes one of them."""
    keys: Set[VarKey] = set(seeds)
    for _ in range(max_depth):
        added = False
        for key in list(keys):
            if key[0] == "local" and key[1] is not None:
                for index in _returned_locals(m, key[1]).get(key[2], ()):
                    for call in m.call_sites(key[1]):
                        for k in _call_targets(m, call, index):
                            if k not in keys:
                                keys.add(k)
                                added = True
        # ``model_ = model``: a name every binding of which is the wrapper's
        for k in _aliases(m, keys):
            keys.add(k)
            added = True
        # passed to a function of the script
        for func, sites in m.call_graph.items():
            if not isinstance(func, FUNCTIONS):
                continue
            for param in m.params(func):
                pkey = ("local", func, param)
                if pkey in keys or param in ("self", "cls"):
                    continue
                args = [m.argument_for(func, c, param) for c in sites]
                if args and all(a is not None and var_key(m, a) in keys and not _before_its_wrap(m, a) for a in args):
                    keys.add(pkey)
                    added = True
        if not added:
            break
    return keys


def _before_its_wrap(m: SemanticModel, arg: ast.AST) -> bool:
    """``optimizer = create_optimizer(model)`` before ``model = nn.DataParallel(model)``: the
    name is wrapped in its function, but only after this use (and not in a loop around
    both), so the function is handed the bare model there."""
    from dp2ddp.model.names import DDP, DP

    if not isinstance(arg, ast.Name):
        return False
    func = m.enclosing_function(arg)
    _, bindings = m.lookup(arg.id, m.scope_of(arg))
    wraps = [b for b in bindings if b.kind == "assign" and isinstance(b.value, ast.Call)
             and m.enclosing_function(b.node) is func
             and any(isinstance(n, ast.Call) and m.qualified_names(n.func) & (DP | DDP) for n in ast.walk(b.value))]
    return bool(wraps) and all(m.runs_before(arg, b.node) for b in wraps)


def _alias_assigns(m: SemanticModel) -> List[ast.Assign]:
    return [a for a in m.nodes(ast.Assign) if len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)
            and isinstance(a.value, ast.Name)]


def _aliases(m: SemanticModel, keys: Set[VarKey]) -> List[VarKey]:
    """Names not yet in ``keys`` bound only to names in ``keys`` (``model_ = model``)."""
    out: List[VarKey] = []
    for a in _alias_assigns(m):
        k = var_key(m, a.targets[0])
        if k is None or k in keys or k in out or var_key(m, a.value) not in keys:
            continue
        _, bindings = m.lookup(a.targets[0].id, m.scope_of(a.targets[0]))
        if bindings and all(b.kind == "assign" and isinstance(b.value, ast.Name) and var_key(m, b.value) in keys
                            for b in bindings):
            out.append(k)
    return out


def half_unwrapped(m: SemanticModel, keys: Set[VarKey]) -> List[ast.Name]:
    """``model_ = model`` where another binding of ``model_`` is ``model.module`` (``if
    parallel: model_ = model.module else: model_ = model``): the script's unwrap, which
    holds the bare model on every path of the original where the wrap was conditional;
    the wrapper names ``model`` it reads."""
    out: List[ast.Name] = []
    for a in _alias_assigns(m):
        key = var_key(m, a.value)
        if key not in keys:
            continue
        _, bindings = m.lookup(a.targets[0].id, m.scope_of(a.targets[0]))
        if any(b.kind == "assign" and isinstance(b.value, ast.Attribute) and b.value.attr == "module"
               and var_key(m, b.value.value) == key for b in bindings):
            out.append(a.value)
    return out


def unwrapped_on_the_other_branch(m: SemanticModel, node: ast.AST) -> bool:
    """``net`` of ``net.module.state_dict() if multi_gpus else net.state_dict()``: the other
    branch of the conditional expression around ``net.state_dict()`` unwraps the same name
    and calls the same method, so the original wrote the bare model's keys on both paths."""
    call = m.parent(m.parent(node))  # ``net.state_dict()``, a branch of the conditional expression
    ifexp = m.parent(call) if call is not None else None
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.value is node
            and isinstance(ifexp, ast.IfExp) and ifexp.test is not call):
        return False
    other = ifexp.orelse if ifexp.body is call else ifexp.body
    f = other.func if isinstance(other, ast.Call) else None
    return (isinstance(f, ast.Attribute) and f.attr == call.func.attr and isinstance(f.value, ast.Attribute)
            and f.value.attr == "module" and m.source(f.value.value) == m.source(node))


def dp_wrapper_keys(m: SemanticModel, functional: bool = False) -> Set[VarKey]:
    """The variables that hold a DataParallel wrapper: those its wraps are assigned to
    (``functional``: the wraps of ``data_parallel(...)`` too), followed by
    :func:`wrapper_keys`. Computed once per model."""
    from dp2ddp.model.wraps import dp_wraps

    key = f"uses:dp_wrapper_keys:{functional}"
    got = m.cache.get(key)
    if got is None:
        seeds: Set[VarKey] = set()
        for w in dp_wraps(m):
            if functional or not w.functional:
                seeds.update(assigned_keys(m, w.outer))
        got = m.cache[key] = wrapper_keys(m, seeds) if seeds else set()
    return got  # type: ignore[return-value]


def dp_wrapper_uses(m: SemanticModel, functional: bool = False) -> List["Use"]:
    """:func:`wrapper_uses` of :func:`dp_wrapper_keys`, computed once per model."""
    key = f"uses:dp_wrapper_uses:{functional}"
    got = m.cache.get(key)
    if got is None:
        keys = dp_wrapper_keys(m, functional)
        got = m.cache[key] = wrapper_uses(m, keys) if keys else []
    return got  # type: ignore[return-value]


def _name_nodes(m: SemanticModel) -> List[ast.AST]:
    return m.nodes(ast.Name, ast.Attribute)


def wrapper_uses(m: SemanticModel, keys: Set[VarKey]) -> List[Use]:
    """Every use of a variable in ``keys``, classified."""
    out: List[Use] = []
    if not keys:
        return out
    names = {k[2] for k in keys if k[0] != "attr"}
    attrs = {k[2][5:] for k in keys if k[0] == "attr"}
    for node in _name_nodes(m):
        if isinstance(node, ast.Name):
            if node.id not in names or not isinstance(node.ctx, ast.Load):
                continue
        else:
            if node.attr not in attrs or not isinstance(node.value, ast.Name):
                continue
            if not isinstance(node.ctx, ast.Load):
                continue
        if var_key(m, node) not in keys:
            continue
        out.append(classify(m, node))
    return out


def classify(m: SemanticModel, node: ast.AST) -> Use:
    parent = m.parent(node)
    if isinstance(parent, ast.Call) and parent.func is node:
        return Use(node, "forward")
    if isinstance(parent, ast.Attribute) and parent.value is node:
        attr = parent.attr
        if attr == "module":
            return Use(node, "module", attr)
        if isinstance(parent.ctx, (ast.Store, ast.Del)):
            return Use(node, "store", attr)
        if attr in STATE_DICT:
            return Use(node, "state_dict", attr)
        if attr in MODULE_API or attr.startswith("__"):
            return Use(node, "api", attr)
        return Use(node, "attribute", attr)
    if isinstance(parent, ast.Call) and node in parent.args:
        target = m.resolve_call(parent)
        if target is not None and isinstance(target, FUNCTIONS):
            return Use(node, "passed", function=target)
    return Use(node, "other")


def requires_grad_changes(m: SemanticModel) -> List[ast.AST]:
    """Places that change ``requires_grad``: ``p.requires_grad = x``, ``.requires_grad_(...)``,
    and calls of functions of this script that do so (transitively)."""
    got = m.cache.get("uses:requires_grad")
    if got is not None:
        return got  # type: ignore[return-value]
    direct: List[ast.AST] = []
    for node in m.nodes(ast.Attribute):
        if node.attr == "requires_grad" and isinstance(node.ctx, ast.Store):
            direct.append(node)
    for call in m.nodes(ast.Call):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "requires_grad_":
            direct.append(call)
    changing: Dict[ast.AST, bool] = {}
    for n in direct:
        f = m.enclosing_function(n)
        if f is not None:
            changing[f] = True
    changed = True
    while changed:
        changed = False
        for call in m.nodes(ast.Call):
            t = m.resolve_call(call)
            if t is not None and t in changing:
                f = m.enclosing_function(call)
                if f is not None and f not in changing:
                    changing[f] = True
                    changed = True
    out = list(direct)
    for call in m.nodes(ast.Call):
        t = m.resolve_call(call)
        if t is not None and t in changing:
            out.append(call)
    out.sort(key=lambda n: (n.lineno, n.col_offset))
    m.cache["uses:requires_grad"] = out
    return out


def sets_true(m: SemanticModel, change: ast.AST) -> Optional[bool]:
    """What a change sets ``requires_grad`` to: ``True``/``False`` when it says, else ``None``."""
    if isinstance(change, ast.Attribute):
        parent = m.parent(change)
        if isinstance(parent, ast.Assign) and isinstance(parent.value, ast.Constant) and isinstance(parent.value.value, bool):
            return parent.value.value
        return None
    if isinstance(change, ast.Call) and isinstance(change.func, ast.Attribute) and change.func.attr == "requires_grad_":
        if not change.args and not change.keywords:
            return True
        v = argument(change, REQUIRES_GRAD_PARAMS, "requires_grad")
        if isinstance(v, ast.Constant) and isinstance(v.value, bool):
            return v.value
        return None
    if isinstance(change, ast.Call):
        for a in list(change.args) + [k.value for k in change.keywords]:
            if isinstance(a, ast.Constant) and isinstance(a.value, bool):
                return a.value
    name = None
    if isinstance(change, ast.Call):
        f = change.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    if name:
        low = name.lower()
        if low.startswith("unfreeze") or "unfreeze" in low:
            return True
        if low.startswith("freeze") or "freeze" in low:
            return False
    return None


def changed_owner(m: SemanticModel, change: ast.AST) -> Optional[ast.AST]:
    """The module whose parameters a ``requires_grad`` change touches: ``X`` of
    ``X.requires_grad_(...)``, or of ``for p in X.parameters(): p.requires_grad = ...``."""
    if isinstance(change, ast.Call) and isinstance(change.func, ast.Attribute) and change.func.attr == "requires_grad_":
        subject = change.func.value
    elif isinstance(change, ast.Attribute):
        subject = change.value
    else:
        return None
    if isinstance(subject, ast.Name):
        for a in m.ancestors(subject):
            if isinstance(a, (ast.For, ast.AsyncFor)) and isinstance(a.target, (ast.Name, ast.Tuple)) and subject.id in {
                n.id for n in ast.walk(a.target) if isinstance(n, ast.Name)
            }:
                it = a.iter
                if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr in ("parameters", "named_parameters"):
                    return it.func.value
                return None
        return subject
    if isinstance(subject, ast.Call) and isinstance(subject.func, ast.Attribute) and subject.func.attr in ("parameters", "named_parameters"):
        return subject.func.value
    return subject if isinstance(subject, ast.Attribute) else None


def unfrozen_in_project(m: SemanticModel) -> Optional[str]:
    """Where a project module the script imports (up to three imports away) sets parameters'
    ``requires_grad`` to ``True`` in a function other than ``__init__`` that walks
    ``.parameters()``: a model whose own methods unfreeze layers during training
    (SiamMask's ``features.unfix(epoch / epochs)`` from the training loop, through
    ``model.module``). DDP averages only the parameters that required grad when it was
    built, so the wrapper must be built over every parameter. ``"path:line"`` or ``None``."""
    import os

    from dp2ddp.model.project_defs import file_model
    from dp2ddp.project import project_modules

    got = m.cache.get("uses:unfrozen-in-project")
    if got is not None:
        return got or None  # type: ignore[return-value]
    found = ""
    if m.path not in ("<string>", "<stdin>", "-") and os.path.exists(m.path):
        for real, (rel, _depth) in sorted(project_modules(m.path).items(), key=lambda kv: kv[1]):
            pm = file_model(real)
            if pm is None:
                continue
            for node in pm.nodes(ast.Attribute):
                if not (node.attr == "requires_grad" and isinstance(node.ctx, ast.Store)):
                    continue
                stmt = pm.statement_of(node)
                value = getattr(stmt, "value", None)
                func = pm.enclosing_function(node)
                if (isinstance(value, ast.Constant) and value.value is True and func is not None
                        and getattr(func, "name", "") != "__init__"
                        and any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                                and c.func.attr in ("parameters", "named_parameters") for c in ast.walk(func))):
                    found = f"{rel}:{node.lineno}"
                    break
            if found:
                break
    m.cache["uses:unfrozen-in-project"] = found
    return found or None


# packages whose model classes do not change which parameters train on their own
_LIBRARY_MODELS = frozenset({"torch", "torchvision", "timm", "transformers", "torchaudio", "segmentation_models_pytorch",
                             "pretrainedmodels", "efficientnet_pytorch", "torch_geometric", "dgl", "mmcv", "mmdet",
                             "detectron2", "fairseq", "pytorch_transformers", "pytorch_pretrained_bert", "diffusers"})


_TRANSFORMERS = frozenset({"transformers", "pytorch_transformers", "pytorch_pretrained_bert"})


def transformers_model_import(m: SemanticModel) -> Optional[str]:
    """A model class the module imports from a transformers-family package
    (``XLNetPreTrainedModel``, ``BertForSequenceClassification``): its ``forward`` is not
    dp2ddp's to read, and such models may leave parameters unused in a step (XLNet's
    ``mask_emb``). ``"`XLNetModel` of transformers.modeling_xlnet"`` or ``None``."""
    for node in ast.walk(m.tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level and node.module.split(".")[0] in _TRANSFORMERS:
            for a in node.names:
                if a.name.endswith("Model") or "For" in a.name:
                    return f"`{a.name}` of {node.module}"
    return None


def transformers_model_in_project(m: SemanticModel) -> Optional[str]:
    """:func:`transformers_model_import` of the module, or else of the first of the project
    modules it imports that has one."""
    import os

    from dp2ddp.model.project_defs import file_model
    from dp2ddp.project import project_modules

    found = transformers_model_import(m)
    if found is not None or m.path in ("<string>", "<stdin>", "-") or not os.path.exists(m.path):
        return found
    for real in sorted(project_modules(m.path, m.tree)):
        pm = file_model(real)
        found = transformers_model_import(pm) if pm is not None else None
        if found is not None:
            return found
    return None


def from_pretrained_model(m: SemanticModel, module: Optional[ast.AST]) -> bool:
    """The wrapped module is made by ``X.from_pretrained(...)`` (a transformers-style model,
    the class picked by the script or derived from one)."""
    from dp2ddp.model.flow import origins

    if module is None:
        return False
    for node, _ in origins(m, module):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained":
            return True
    return False


def unread_model_class(m: SemanticModel, module: Optional[ast.AST]) -> Optional[str]:
    """The class a wrapped module is made from, where it comes from a module dp2ddp cannot
    read: not beside the script, not a library (``from custom import Custom`` of SiamMask's
    experiment folder, put on ``sys.path`` by its run script). Its code may freeze and
    unfreeze parameters during training, which DDP must know when it is built. ``"Custom
    (custom)"`` or ``None``."""
    import importlib.util

    from dp2ddp.model.flow import origins
    from dp2ddp.model.project_defs import project_def

    if module is None:
        return None
    for node, _ in origins(m, module):
        if not (isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute))):
            continue
        if m.resolve_call(node) is not None or project_def(m, node.func) is not None:
            continue
        root = root_name(node.func)
        if root is None or not m.is_imported(root):
            continue  # a local name (``Model = eval(model_type)``), not a class imported from a module
        for q in m.qualified_names(node.func):
            owner, _, name = q.rpartition(".")
            top = owner.split(".")[0]
            if not owner or not name[:1].isupper() or top in _LIBRARY_MODELS or top == "builtins":
                continue
            try:
                spec = importlib.util.find_spec(top)
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                return f"`{name}` ({owner})"
    return None
