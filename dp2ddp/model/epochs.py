"""Where a DataLoader is iterated, and the epoch loops around it.

* :func:`loader_handles`: the names a loader is held by — where it is built (a name,
  ``self.x``, ``loaders["train"]``), the names a helper's return value is given, and aliases
  such as ``it = tqdm(loader)``.
* :func:`iteration_sites`: where those names are iterated, directly, through
  ``enumerate``/``tqdm``/``iter`` (:func:`unwrap_iter`), or passed to a function such as
  ``train(model, loader, epoch)``; a loader made again in ``except StopIteration:``
  (:func:`in_stop_iteration`) is not a new pass.
* :func:`epoch_loops`: for a loader, the loops around its iteration that run once per
  epoch, with the expression that names the loader there, found up to the nearest loop, in
  the same function or around the calls of that function; :func:`calls_set_epoch`: whether
  such a loop reaches a ``.set_epoch(...)``.

The loaders themselves are :func:`dp2ddp.model.loaders.loaders`.
"""

from __future__ import annotations

import ast
import builtins
from typing import Dict, List, Optional, Set, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.handles import Handle, expr_handle, handle_of, item_handle
from dp2ddp.model.loaders import Loader
from dp2ddp.model.syntax import FUNCTIONS, LOOPS, terminal

PASS_THROUGH = {"enumerate", "tqdm", "iter", "zip", "trange", "progress_bar", "track", "cycle", "islice", "prefetch"}
MAX_DEPTH = 4


_NOT_THROUGH = {"range", "len", "sorted", "list", "tuple", "set", "dict", "reversed", "sum", "min", "max", "map", "filter"}


def unwrap_iter(expr: ast.AST, strict: bool = False) -> ast.AST:
    """``enumerate(tqdm(loader))`` -> ``loader``; unless ``strict``, an iterator wrapper of
    another module (``IteratorTimer(loader)``, ``Prefetcher(loader)``) passes through too."""
    while isinstance(expr, ast.Call) and expr.args and not isinstance(expr.args[0], ast.Starred):
        name = terminal(expr.func)
        if name in _NOT_THROUGH or name == "DataLoader":
            break
        if name not in PASS_THROUGH and (strict or not (name and name[:1].isupper())):
            break
        expr = expr.args[0]
    return expr


def loader_handles(m: SemanticModel, loader: Loader) -> Dict[Handle, str]:
    """handle -> the expression (valid in that handle's scope) that names the loader."""
    out: Dict[Handle, str] = {}
    if isinstance(loader.target, (ast.Name, ast.Attribute)):
        h = handle_of(m, loader.target)
        if h is not None:
            out[h] = m.source(loader.target)
    elif isinstance(loader.target, ast.Subscript):
        # loaders["train"] = DataLoader(...): the subscript text
        h = expr_handle(m, loader.target)
        if h is not None:
            out[h] = m.source(loader.target)
    elif isinstance(loader.holder, (ast.Name, ast.Attribute)):
        # loaders = {"train": DataLoader(...)} / {x: DataLoader(...) for x in KEYS}: the
        # items of its training keys
        h = handle_of(m, loader.holder)
        if h is not None:
            for key in loader.train_keys:
                hk = item_handle(m, h, loader.holder, key)
                out[hk] = hk[1]
    func = loader.function
    if func is not None:
        returned: List[Optional[int]] = []
        for ret in ast.walk(func):
            if not isinstance(ret, ast.Return) or ret.value is None or m.enclosing_function(ret) is not func:
                continue
            values = ret.value.elts if isinstance(ret.value, ast.Tuple) else [ret.value]
            for i, v in enumerate(values):
                if v is loader.call or (
                    isinstance(v, ast.Name) and isinstance(loader.target, ast.Name) and loader.target.id == v.id
                ):
                    returned.append(i if isinstance(ret.value, ast.Tuple) else None)
        for index in returned:
            for call in m.call_sites(func):
                parent = m.parent(call)
                if not (isinstance(parent, ast.Assign) and parent.value is call and len(parent.targets) == 1):
                    continue
                tgt = parent.targets[0]
                if index is not None:
                    if not isinstance(tgt, (ast.Tuple, ast.List)) or index >= len(tgt.elts):
                        continue
                    tgt = tgt.elts[index]
                if isinstance(tgt, (ast.Name, ast.Attribute)):
                    h = handle_of(m, tgt)
                    if h is not None:
                        out[h] = m.source(tgt)
    # aliases: ``it = tqdm(loader)`` names the same loader
    for assign in m.nodes(ast.Assign):
        if len(assign.targets) != 1:
            continue
        tgt = assign.targets[0]
        inner = unwrap_iter(assign.value)
        if inner is assign.value or not isinstance(tgt, (ast.Name, ast.Attribute)):
            continue
        h_inner = handle_of(m, inner) if isinstance(inner, (ast.Name, ast.Attribute)) else None
        if h_inner in out:
            h = handle_of(m, tgt)
            if h is not None and h not in out:
                out[h] = out[h_inner]  # type: ignore[index]
    return out


def _enclosing_loop(m: SemanticModel, node: ast.AST) -> Optional[ast.AST]:
    """The loop around ``node`` that runs once per epoch: not a loop over the keys of a dict
    or a literal of constants (``for phase in ["train", "val"]``), which runs within one."""
    from dp2ddp.model.flow import key_loop

    child = node
    for a in m.ancestors(node):
        if isinstance(a, FUNCTIONS + (ast.ClassDef, ast.Lambda)):
            return None
        if isinstance(a, LOOPS) and any(child is s for s in a.body) and key_loop(m, a) is None:
            return a
        child = a
    return None


def _site_handles(m: SemanticModel, expr: ast.AST) -> List[Handle]:
    """The handles an iterated expression names: its own, and where it is one item of a
    dict chosen by a key loop (``loaders[phase]``; ``loader`` of ``for phase, loader in
    loaders.items()``) the handle of that item under each key."""
    from dp2ddp.model.flow import binding_loop

    out = []
    h = expr_handle(m, expr)
    if h is not None:
        out.append(h)
    container, kl = None, None
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Name):
        kl = binding_loop(m, expr.slice)
        container = expr.value if kl is not None and kl.key == expr.slice.id else None
    elif isinstance(expr, ast.Name):
        kl = binding_loop(m, expr)
        container = kl.container if kl is not None and kl.value == expr.id else None
    if container is not None and kl is not None and isinstance(container, (ast.Name, ast.Attribute)):
        hc = handle_of(m, container)
        if hc is not None:
            out.extend(item_handle(m, hc, container, k) for k in kl.keys)
    return out


def _through_aliases(m: SemanticModel, expr: ast.AST) -> ast.AST:
    """``progress = enumerate(data_loader)`` (in every branch), then ``for b in progress``:
    ``data_loader``."""
    for _ in range(3):
        if not isinstance(expr, ast.Name):
            return expr
        _, bindings = m.lookup(expr.id, m.scope_of(expr))
        values = [b.value for b in bindings if b.kind == "assign" and b.value is not None]
        if not values or len(values) != len(bindings):
            return expr
        inner = [unwrap_iter(v, strict=True) for v in values]
        if any(i is v for i, v in zip(inner, values)) or len({ast.dump(i) for i in inner}) != 1:
            return expr
        expr = inner[0]
    return expr


def in_stop_iteration(m: SemanticModel, node: ast.AST) -> bool:
    """``node`` is in an ``except StopIteration:`` handler (an endless loader made again)."""
    for a in m.ancestors(node):
        if isinstance(a, ast.ExceptHandler):
            return a.type is not None and "StopIteration" in m.source(a.type)
        if isinstance(a, FUNCTIONS):
            return False
    return False


# methods that take a loader without iterating it
_NOT_ITERATING = frozenset({"append", "extend", "add", "info", "debug", "warning", "log", "format", "write"})


def iteration_sites(m: SemanticModel, handles: Dict[Handle, str]) -> List[Tuple[ast.AST, str]]:
    """Where the loader is iterated: ``(the For node or the call passing it on, expression)``."""
    sites = []
    for loop in m.nodes(ast.For) + m.nodes(ast.AsyncFor):
        it = _through_aliases(m, unwrap_iter(loop.iter))
        named = [h for h in _site_handles(m, it) if h in handles]
        if named:
            sites.extend((loop, handles[h]) for h in named)
            continue
        h = expr_handle(m, it)
        if h is None:
            continue
        func = m.enclosing_function(loop)
        if func is None or not isinstance(it, ast.Name) or it.id not in m.params(func):
            continue
        for call in m.call_sites(func):
            arg = m.argument_for(func, call, it.id)
            if arg is None:
                continue
            arg = unwrap_iter(arg)
            h2 = expr_handle(m, arg)
            if h2 in handles:
                sites.append((call, handles[h2]))  # type: ignore[index]
    for call in m.nodes(ast.Call):
        f = call.func
        if isinstance(f, ast.Name) and f.id == "iter":
            # next(iter(loader)) inside a loop, or a `while` that pulls batches
            arg = call.args[0] if call.args else None
            h = handle_of(m, arg) if arg is not None else None
            if h in handles and not isinstance(m.parent(call), (ast.For, ast.AsyncFor)) and not in_stop_iteration(m, call):
                sites.append((call, handles[h]))  # type: ignore[index]
            continue
        # train(config, train_loader, model, epoch) where train comes from another module:
        # the loop around that call drives the loader (the same reading as check's DDP002)
        if (isinstance(f, ast.Name) and hasattr(builtins, f.id)) or (isinstance(f, ast.Attribute) and f.attr in _NOT_ITERATING):
            continue
        for arg in list(call.args) + [k.value for k in call.keywords]:
            h = handle_of(m, arg)
            if h in handles:
                if m.resolve_call(call) is None:
                    sites.append((call, handles[h]))  # type: ignore[index]
                break
    return sites


def _epoch_loops_from(m: SemanticModel, site: ast.AST, expr_text: str, depth: int, seen: Set) -> List[Tuple[ast.AST, str]]:
    loop = _enclosing_loop(m, site)
    if loop is not None:
        return [(loop, expr_text)]
    func = m.enclosing_function(site)
    if func is None or depth >= MAX_DEPTH or func in seen:
        return []
    seen = seen | {func}
    out = []
    try:
        expr = ast.parse(expr_text, mode="eval").body
    except SyntaxError:  # pragma: no cover - the text came from the source
        return []
    params = m.params(func)
    root = expr
    while isinstance(root, (ast.Attribute, ast.Subscript)):
        root = root.value
    for call in m.call_sites(func):
        if isinstance(root, ast.Name) and root.id == "self":
            cc, cf = m.enclosing_class(call), m.enclosing_class(func)
            f = call.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                if cc is not None and cf is not None and m.root_class(cc) is m.root_class(cf):
                    out.extend(_epoch_loops_from(m, call, expr_text, depth + 1, seen))
            elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                # trainer.training(epoch): self.train_loader is trainer.train_loader there
                out.extend(_epoch_loops_from(m, call, f.value.id + expr_text[len("self"):], depth + 1, seen))
        elif isinstance(root, ast.Name) and root.id in params:
            arg = m.argument_for(func, call, root.id)
            if arg is None or not isinstance(arg, (ast.Name, ast.Attribute)):
                continue
            text = m.source(arg) + expr_text[len(root.id):]
            out.extend(_epoch_loops_from(m, call, text, depth + 1, seen))
        elif isinstance(root, ast.Name) and root.id != "self":
            # a module global, visible from the caller too (unless the caller binds it)
            where, _ = m.lookup(root.id, m.scope_of(call))
            if where is None or where.kind == "module":
                out.extend(_epoch_loops_from(m, call, expr_text, depth + 1, seen))
    return out


def epoch_loops(m: SemanticModel, loader: Loader) -> List[Tuple[ast.AST, str]]:
    """``(loop, expression naming the loader inside it)`` for every epoch loop of ``loader``."""
    handles = loader_handles(m, loader)
    out: List[Tuple[ast.AST, str]] = []
    seen = set()
    for site, text in iteration_sites(m, handles):
        start = m.parent(site) if isinstance(site, (ast.For, ast.AsyncFor)) else site
        if isinstance(site, (ast.For, ast.AsyncFor)):
            # the loop over the loader is the batch loop; the epoch loop is around it
            loops = _epoch_loops_from(m, site, text, 0, set())
            loops = [(lp, t) for lp, t in loops if lp is not site]
        else:
            loops = _epoch_loops_from(m, start, text, 0, set())
        for lp, t in loops:
            if m.contains(lp, loader.call):
                continue  # the loop builds the loader: not an epoch loop of it
            if (id(lp), t) not in seen:
                seen.add((id(lp), t))
                out.append((lp, t))
    return out


def calls_set_epoch(m: SemanticModel, loop: ast.AST) -> bool:
    """The loop (or a function it calls, transitively, overrides of methods included) calls
    ``.set_epoch(...)``."""
    return any(isinstance(c.func, ast.Attribute) and c.func.attr == "set_epoch" for c in m.reached_calls(loop))
