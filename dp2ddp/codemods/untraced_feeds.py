"""Values the training loops iterate that are not a loader :mod:`shard_loaders` planned:
passed through where they wrap, collect or yield a sharded loader, sharded at run time where
the script names a loader, else refused (DDP105: every rank would train on all of it)."""

from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding
from dp2ddp.model.held_loaders import held_loader
from dp2ddp.model.loaders import loaders
from dp2ddp.model.names import DATALOADER
from dp2ddp.model.syntax import is_main_test, terminal
from dp2ddp.model.training_feeds import NOT_DATA


def _keeps_sharded_loaders(m, node: ast.AST) -> bool:
    """``node`` makes an object of a class of this script that builds training DataLoaders
    itself (deep-text-recognition's ``Batch_Balanced_Dataset``, one loader per data source,
    pulled with ``get_batch()``): they are sharded where the class makes them."""
    from dp2ddp.model.project_defs import class_of_call

    found = class_of_call(m, node)
    return found is not None and found[0] is m and any(ld.training and m.contains(found[1], ld.call) for ld in loaders(m))


def untraced_feeds(ctx: Context, known: set) -> Tuple[List[Finding], List[Tuple[ast.stmt, List[str]]]]:
    """Values training loops iterate that are not a loader sharded above. Each is

    * passed through when it is a call that wraps a sharded loader (``inf_loop(loader)``,
      ``Prefetcher(loader)``: a project's iterator wrapper);
    * sharded at run time where the script names it, when that name says it holds a loader
      (``data_loader = config.init_obj("data_loader", module)``: ``data_loader =
      shard_loader(data_loader)`` after it, and shard_loader fails loudly on anything but a
      DataLoader);
    * else refused: a generator, a list of batches, a value of unknown make — every rank
      would train on all of it."""
    from dp2ddp.model.batches import hand_loops
    from dp2ddp.model.flow import origins
    from dp2ddp.model.phase_keys import fed_origins
    from dp2ddp.model.settings_loops import settings_loops
    from dp2ddp.model.training_feeds import fed_values, handed_values

    m = ctx.m
    unknown: List[Tuple[ast.AST, ast.AST, ast.AST]] = []  # (origin, value, loop)
    seen = set()
    # batches a loop cuts from its own tensors (``zip(x.split(bs), y.split(bs))``) are
    # shared by rank by hand_batches: not a loader to trace
    cut = [c.node for hl in hand_loops(m) for c in hl.cuts if c.kind == "iterable"]
    settings = {id(s.loop): s for s in settings_loops(m)}
    out: List[Finding] = []
    for value, loop in fed_values(m) + handed_values(m):  # loop: a training loop, or the call handing it to one
        if any(c is value or m.contains(c, value) for c in cut):
            continue
        s = settings.get(id(loop))
        if s is not None and s.same:
            continue  # a list of settings, not data: every rank runs every item, as the original did
        if s is not None and s.unsure is not None and s.within is not None and id(loop) not in seen:
            seen.add(id(loop))
            out.append(ctx.block(value, "DDP105", _unsure_settings(m, s)))
            continue
        found = fed_origins(m, value, loop) if not isinstance(loop, ast.Call) else origins(m, value)
        for node, path in found:
            if (id(node), path) in known or (id(node), ()) in known or id(node) in seen:
                continue
            if isinstance(node, (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.JoinedStr)):
                continue
            if isinstance(node, ast.Call) and (terminal(node.func) in NOT_DATA or m.call_is(node, DATALOADER)):
                continue
            if _handed_by_entry(ctx, node):
                continue  # the entry script's migration shards what it hands this parameter
            if _keeps_sharded_loaders(m, node):
                continue  # an object of this script's class whose own loaders are sharded where it makes them
            seen.add(id(node))
            unknown.append((node, value, loop))
    rebinds: List[Tuple[ast.stmt, List[str]]] = []
    feeds = {id(n) for n, _, _ in unknown} | {k[0] for k in known}
    for node, _value, _loop in unknown:
        if _wraps(m, node, feeds):
            continue  # a wrapper of a loader: decided once that loader is
        target = _loader_name(m, node, _value) or _holder_name(m, node)
        if target is None:
            continue
        stmt = m.statement_of(node)
        known.add((id(node), ()))
        if _on_some_paths(m, stmt):
            # sharded after it, the name would stay unsharded on the path that skips it (a
            # Prefetcher made only ``if prefetch:``, the loader itself set by a base class
            # in another module on the other path)
            out.append(ctx.block(node, "DDP105", f"`{target}` is set here only on some paths (line {m.position(stmt)[0]} is "  # type: ignore[arg-type]
                                 "under a condition) and comes from elsewhere on the others: dp2ddp cannot shard it on "
                                 "every path; shard the loader where it is made, by hand"))
            continue
        rebinds.append((stmt, [target]))  # type: ignore[arg-type]
    for node, value, loop in unknown:
        if (id(node), ()) in known or _wraps_known(m, node, known) or _yields_known(m, node, known) or _collects_known(m, node, known):
            continue
        line = m.position(loop)[0]
        what = m.brief(node)
        where = (f"the training loop at line {line}" if not isinstance(loop, ast.Call) else
                 f"`{m.source(loop.func)}(...)` (line {line}, whose training loop is in another module)")
        imported = _imported_by_name(m, node)
        if imported is not None:
            out.append(ctx.block(value, "DDP105", (
                f"{where} iterates `{m.source(value)}`, which on one path is what `{what}` (line {m.position(node)[0]}) returns: "
                f"a function of a module imported by name at run time (`{m.source(imported)}`, line {m.position(imported)[0]}) "
                "that dp2ddp cannot read, so it cannot shard what it returns (every rank would train on all of it); "
                "build that loader with a DataLoader in the script, or shard it in that module by hand")))
            continue
        out.append(ctx.block(value, "DDP105", f"{where} iterates `{m.source(value)}`, made by `{what}` "
                             f"(line {m.position(node)[0]}), which dp2ddp cannot trace to a DataLoader: every rank would train "
                             "on all of it; shard it by hand or build it with a DataLoader"))
    return out, rebinds


def _imported_by_name(m, node: ast.AST) -> Optional[ast.Call]:
    """``lib.data_loader(...)`` where ``lib = importlib.import_module(name)``: that call."""
    from dp2ddp.model.flow import origins

    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    for made, _ in origins(m, node.func.value):
        if isinstance(made, ast.Call) and m.qualified_names(made.func) & {"importlib.import_module", "builtins.__import__"}:
            return made
    return None


def _unsure_settings(m, s) -> str:
    """DDP105 for a loop over settings whose items may differ between the ranks."""
    line = m.position(s.loop)[0]
    inside = (f", inside the training step of the loop at line {m.position(s.within)[0]} (a backward pass per item before one "
              "optimizer step)" if s.within is not None else "")
    return (f"the training loop at line {line} iterates `{' '.join(m.source(s.value).split())}`, a list of settings, not data{inside}; but "
            f"dp2ddp cannot show its items are the same on every rank (`{m.source(s.unsure)}`, line {m.position(s.unsure)[0]}): "
            "ranks that train different items would have DDP average unrelated gradients; make the items from the script's "
            "options or constants, or draw them alike on every rank and migrate by hand")


def _handed_by_entry(ctx: Context, node: ast.AST) -> bool:
    """In a project module migrated with its entry script: ``node`` is a parameter of a
    function here (a class's ``__init__``) that only callers elsewhere bind, and the entry
    script hands it the training value (:attr:`dp2ddp.migrate.Options.handed`)."""
    handed = getattr(ctx.options, "handed", ())
    if not handed or not isinstance(node, ast.Name):
        return False
    m = ctx.m
    _, bindings = m.lookup(node.id, m.scope_of(node))
    if not bindings or any(b.kind != "param" for b in bindings):
        return False
    fn = bindings[0].scope.node  # the function whose parameter it is
    return isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and (fn.name, fn.lineno, node.id) in handed


def _loader_name(m, node: ast.AST, value: Optional[ast.AST] = None) -> Optional[str]:
    """``name = <call>`` where the name says it holds a loader; or ``train_loader,
    test_loader = dataset.get10(...)`` (a project helper that returns its loaders in a
    list), where ``value``, the name the training loop iterates, is one of the names
    unpacked and says it holds a loader; or ``trainloader = data.loader_train``, an attribute of
    an object of the project's (HRank's data holder) whose name says it holds a loader."""
    if not (isinstance(node, ast.Call) or (isinstance(node, ast.Attribute) and "loader" in node.attr.lower())):
        return None
    parent = m.parent(node)
    if not (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1):
        return None
    t = parent.targets[0]
    if isinstance(t, (ast.Tuple, ast.List)) and isinstance(value, ast.Name):
        named = [e for e in t.elts if isinstance(e, ast.Name) and e.id == value.id]
        if len(named) != 1 or any(isinstance(e, ast.Starred) for e in t.elts):
            return None
        t = named[0]
    label = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
    if "loader" not in label.lower() or not isinstance(t, (ast.Name, ast.Attribute)):
        return None
    return m.source(t)


def _holder_name(m, node: ast.AST) -> Optional[str]:
    """``name = Batches(...)`` of a class that iterates the one DataLoader it holds
    (:class:`dp2ddp.model.held_loaders.HeldLoader`): ``name.<attribute>``, the loader to shard."""
    held = held_loader(m, node)
    if held is None:
        return None
    parent = m.parent(node)
    if not (isinstance(parent, ast.Assign) and parent.value is node and len(parent.targets) == 1):
        return None
    t = parent.targets[0]
    if not isinstance(t, (ast.Name, ast.Attribute)):
        return None
    return f"{m.source(t)}.{held.attribute}"


def _wraps(m, node: ast.AST, feeds: set) -> bool:
    """A call whose first argument is (among other things) one of ``feeds``."""
    from dp2ddp.model.flow import origins

    if not isinstance(node, ast.Call) or not node.args or isinstance(node.args[0], ast.Starred):
        return False
    return any(id(n) in feeds for n, _ in origins(m, node.args[0]))


def _all_known(m, got, known) -> bool:
    """Every origin in ``got`` is a loader value already planned (itself, or the whole of it),
    and none an evaluation loader this migration keeps whole on every rank (a list of its
    batches, or a wrapper of it, fed to training would train every rank on all of it)."""
    evaluation = {id(ld.call) for ld in loaders(m) if not ld.training}
    return (bool(got) and all((id(n), p) in known or (id(n), ()) in known for n, p in got)
            and not any(id(n) in evaluation for n, _ in got))


def _wraps_known(m, node: ast.AST, known: set) -> bool:
    """``inf_loop(loader)``: a call whose first argument is only sharded loaders."""
    from dp2ddp.model.flow import origins

    if not isinstance(node, ast.Call) or not node.args or isinstance(node.args[0], ast.Starred):
        return False
    got = origins(m, node.args[0])
    return _all_known(m, got, known)


def _collects_known(m, node: ast.AST, known: set) -> bool:
    """``[batch for batch in train_dataloader]`` (SpanBERT's list of batches, shuffled by the
    script each epoch): a comprehension over sharded loaders only, one ``for`` and no ``if``,
    which holds one element per batch of the loader: under DDP, this rank's share of every
    batch, in the loader's order. (A filter could keep other batches on each rank: not one.)"""
    from dp2ddp.model.flow import origins

    if not isinstance(node, (ast.ListComp, ast.GeneratorExp)) or len(node.generators) != 1:
        return False
    gen = node.generators[0]
    return not gen.ifs and not gen.is_async and _all_known(m, origins(m, gen.iter), known)


def _yields_known(m, node: ast.AST, known: set) -> bool:
    """A generator of the script (``sample_data(...)``) that yields only batches of sharded
    loaders."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.training_feeds import yielded_values

    values = yielded_values(m, node)
    got = [o for v in values for o in origins(m, v)]
    return _all_known(m, got, known)


def _on_some_paths(m, stmt: ast.AST) -> bool:
    """``stmt`` runs only on some paths of its function (under an ``if`` other than the
    ``__main__`` guard, in a ``try``)."""
    return any(isinstance(a, ast.Try) or (isinstance(a, ast.If) and where != "test" and not is_main_test(a.test))
               for a, where in m.branches(stmt))
