"""Replace ``DataParallel(...)`` wraps by ``DistributedDataParallel``.

* ``DataParallel(m, device_ids=..., output_device=...)`` becomes
  ``DistributedDataParallel(m, device_ids=[current device] if CUDA else None)``; the
  module is on its device before it is wrapped: ``DP(m).cuda()`` becomes
  ``DDP(m.cuda())``, and ``m = DP(m)`` followed by ``m.to(device)`` moves the wrap below
  the ``.to``.
* A wrap under ``if`` (``if torch.cuda.device_count() > 1:``) moves after the ``if`` —
  every rank must wrap, also on CPU — and never out of the ``__main__`` guard, a loop or
  a function. On one device the original had no wrapper: its checkpoints keep their keys
  (``state_dict``/``load_state_dict`` go through ``.module``).
* A partial wrap (``model.features = DP(model.features)``) becomes one wrap of the whole
  model, so that DDP averages the gradients of every trained parameter.
* A wrap that only serves evaluation (inside a function that never trains and keeps the
  wrapper to itself) is removed: each rank evaluates with the module it has.
* Uses of the model's own attributes and methods through the wrapped name go through
  ``.module`` (``model.predict(x)``, ``self.model.num_classes``), also in the functions
  of the script the model is passed to.
* A script that changes ``requires_grad`` after the wrap gets
  ``find_unused_parameters=True``; one that unfreezes parameters that were frozen when
  the wrapper was built is refused (DDP would never synchronise them).
* Type checks (``isinstance(m, nn.DataParallel)``) name the new wrapper.

Anything else (``dim != 0``, unknown arguments, aliases, subclasses) blocks the file.

This module holds :func:`propose` and the edit at each wrap site; the rest lives beside
it: the refusals checked before any transform runs (:mod:`.wrap_problems`), the wraps
taken off (:mod:`.unwrap`), the wrap moved below the module's placement
(:mod:`.wrap_hoist`; where it goes is :mod:`dp2ddp.model.wrap_placement`'s fact),
``find_unused_parameters`` (:mod:`.find_unused`), and the uses routed through
``.module``, the type checks and the import (:mod:`.wrapper_refs`). How a wrap relates to
the other wraps of its model (a part wrapped, a re-wrap, the script's own DDP beside it) is a
fact of the model, :mod:`dp2ddp.model.wrap_relations`.
"""

from __future__ import annotations

import ast
from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst

from dp2ddp.codemods.context import Context
from dp2ddp.codemods.facts import Wrappers
from dp2ddp.codemods.find_unused import needs_find_unused
from dp2ddp.codemods.unwrap import eval_only, remove_wrap, unwrapped_text, without_parameters_why
from dp2ddp.codemods.wrap_hoist import (
    Hoist,
    cuda_first,
    drop_emptied_if,
    early_note,
    hoist_at,
    insert_hoisted,
    placed_at_wrap,
    placed_late,
    unwrap_in_place,
)
from dp2ddp.codemods.wrapper_refs import remove_imports, route_uses, type_refs
from dp2ddp.engine import Finding, InsertAfter, Remove, Replace
from dp2ddp.model.collectives import VarKey, assigned_keys, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.bound import binding_conditions, maybe_unbound
from dp2ddp.model.cuda_only import count_test, device_test, ran_on_every_gpu_machine
from dp2ddp.model.kinds import is_module_class, wraps_a_part_of_its_module
from dp2ddp.model.placed_elsewhere import placed_anywhere, placed_by_caller, placed_by_maker
from dp2ddp.model.wrap_placement import absorb_placement, late_cuda, late_placements, placed_by_dataparallel
from dp2ddp.model.rebound_wrappers import regrown_after_wrap, rebound_trained, replaced_after_wrap
from dp2ddp.model.syntax import FUNCTIONS, LOOPS, root_name, terminal
from dp2ddp.model.uses import wrapper_keys
from dp2ddp.model.wrap_context import fresh_each_pass
from dp2ddp.model.wrap_relations import (
    beside_own_ddp,
    caller_flag,
    key_flags,
    keys_saved,
    module_like,
    parts_called_alone,
    rewrapped_later,
    wrapped_above,
    wrapped_keys,
    wrapped_whole,
    wraps_a_part,
)
from dp2ddp.model.wraps import Wrap, dp_subclasses, dp_wraps

PROVIDES = (Wrappers,)


def propose(ctx: Context) -> List[Finding]:
    m = ctx.m
    out: List[Finding] = []
    wrappers = Wrappers()
    ctx.provide(wrappers)
    wraps = [w for w in dp_wraps(m) if not w.functional]
    out.extend(_rebase(ctx))

    keep: List[Wrap] = []
    for w in wraps:
        bare = without_parameters_why(m, w)
        if bare:
            out.append(remove_wrap(ctx, w, bare))
        elif eval_only(m, w) or ctx.mode == "mixed":
            out.append(remove_wrap(ctx, w))
        else:
            keep.append(w)
    if ctx.mode == "mixed":
        out.extend(type_refs(ctx))
        out.extend(remove_imports(ctx))
        # the variables the fallback wrapped hold a wrapper under the migration too (the own
        # path's DDP, or wrap_alone's): a whole-object save of one saves its module
        seeds = {k for w in wraps if w.target is not None for k in [var_key(m, w.target)] if k is not None}
        wrappers.seeds = seeds
        wrappers.keys = wrapper_keys(m, seeds) if seeds else set()
        return out

    hoists: Dict[Tuple[int, str], Hoist] = {}
    seeds: Set[VarKey] = set()
    guarded_keys: Set[VarKey] = set()
    flagged_keys: Set[VarKey] = set()  # wrapped under a switch of the user's (``if args.parallel:``)
    cuda_keys: Set[VarKey] = set()  # guarded by a test that holds with CUDA (``if device == "cuda":``)
    find_unused = needs_find_unused(ctx, keep, out)
    if any(f.severity == "error" for f in out):
        return out
    done_ifexp: Set[int] = set()
    for w in keep:
        ifexp = m.parent(w.outer)
        if isinstance(ifexp, ast.IfExp) and ifexp.test is not w.outer:
            if id(ifexp) in done_ifexp:
                continue
            done_ifexp.add(id(ifexp))
            got, keys, conditional = _ifexp_wrap(ctx, ifexp, [x for x in keep if m.parent(x.outer) is ifexp], find_unused)
            out.extend(got)
            if any(f.severity == "error" for f in got):
                return out
            seeds.update(keys)
            if conditional and count_test(m, ifexp.test):
                guarded_keys.update(keys)
                if ran_on_every_gpu_machine(m, [ifexp.test]):
                    cuda_keys.update(keys)
            elif conditional and device_test(m, ifexp.test):
                flagged_keys.update(keys)
            continue
        changed = _rebound_trained(ctx, w) or _replaced(ctx, w)
        if changed is not None:
            out.append(changed)
            return out
        flag_kept = caller_flag(m, w) and any(x is not w and not x.conditions for x in keep)
        if flag_kept:
            # `if parallel: model = DP(model)` in a factory the caller controls, beside an
            # unconditional wrap elsewhere: keep the caller's choice, as DDP
            got = _flag_kept(ctx, w, find_unused)
        else:
            got = _wrap_site(ctx, w, hoists, find_unused)
        out.extend(got)
        if any(f.severity == "error" for f in got):
            return out
        if w.sync_bn:
            out.append(ctx.note(w.call, "DDP100", f"{m.source(w.call.func)}() synchronised BatchNorm across the GPUs: under DDP its "
                                "BatchNorm layers become torch.nn.SyncBatchNorm (with CUDA, as SyncBatchNorm runs on GPUs only)", []))
        target = w.target
        if target is not None:
            keys = wrapped_keys(m, w)
            seeds.update(keys)
            guarded, flagged, cuda = key_flags(m, w, flag_kept)
            if guarded:
                guarded_keys.update(keys)
            if cuda:
                cuda_keys.update(keys)  # its keys there are `module.` ones
            if flagged:
                flagged_keys.update(keys)
    for hoist in hoists.values():
        out.append(insert_hoisted(ctx, hoist, find_unused))
    if ctx.role == "entry":
        # the wrapper a helper module returns (`model = models.build(args)`) is a wrapper here too
        from dp2ddp.model.wrap_context import project_wrapper_returns

        for call, guarded in project_wrapper_returns(m):
            keys = set(assigned_keys(m, call))
            seeds |= keys
            if guarded:
                guarded_keys |= keys
    wrappers.seeds, wrappers.guarded = seeds, guarded_keys
    wrappers.keys = wrapper_keys(m, seeds) if seeds else set()
    out.extend(route_uses(ctx, seeds, guarded_keys, [(w.stmt, m.source(w.target) if w.target is not None else None) for w in keep],
                          flagged=flagged_keys, cuda=cuda_keys))
    out.extend(type_refs(ctx))
    out.extend(remove_imports(ctx))
    return out


# --------------------------------------------------------------------------- wrap sites


def _rebound_trained(ctx: Context, w: Wrap) -> Optional[Finding]:
    """The wrapper's name holds another model later, and that model trains: the original
    trains it without DataParallel on the whole batch; under DDP each rank would train its
    own copy on its share, never synchronised (:mod:`dp2ddp.model.rebound_wrappers`)."""
    m = ctx.m
    if w.stmt is None or w.target is None:
        return None
    found = rebound_trained(m, w.stmt, w.target)
    if found is None:
        return None
    name = m.source(w.target)
    bound = m.source(found.binding).strip().splitlines()[0][:60]
    line = m.position(found.binding)[0]
    use_line = m.position(found.use)[0]
    fork = _other_branch(m, w.stmt, found.binding)
    if found.trains and fork is not None:
        trains = m.source(found.use).strip().splitlines()[0][:60]
        return ctx.block(w.call, "DDP101", (
            f"`{bound}` (line {line}, on the other branch of the `if` at line {fork.lineno}) binds `{name}` to a model that "
            f"DataParallel never wraps, and `{trains}` (line {use_line}) trains it: under DDP that path would train a copy "
            "on each rank, on its share of the batches, never synchronised; wrap the model on every path, then migrate"))
    if found.trains:
        trains = m.source(found.use).strip().splitlines()[0][:60]
        return ctx.block(w.call, "DDP101", (
            f"`{bound}` (line {line}) binds `{name}` to another model after the wrap, and `{trains}` (line {use_line}) "
            "trains that one, which DataParallel never wrapped: under DDP each rank would train its own copy on its share of "
            "the batches, never synchronised; wrap it too (or give it a name of its own and keep its data whole), then migrate"))
    use = m.source(m.parent(found.use) or found.use).strip().splitlines()[0][:60]
    if fork is not None:
        return ctx.block(w.call, "DDP101", (
            f"`{bound}` (line {line}, on the other branch of the `if` at line {fork.lineno}) binds `{name}` to a model that "
            f"DataParallel never wraps, and `{use}` (line {use_line}) uses whichever ran: the wrapper on one path, the bare "
            f"model on the other, and the migration, which follows the wrapper by the name `{name}`, cannot tell which it "
            "holds there; wrap the model on every path (or give the bare one a name of its own), then migrate"))
    return ctx.block(w.call, "DDP101", (
        f"`{bound}` (line {line}) binds `{name}` to a value other than the wrapper after the wrap, and `{use}` (line {use_line}) uses that "
        f"one: the migration follows the wrapper by the name `{name}` and would treat it as the DistributedDataParallel "
        "wrapper (`.module` that a bare module does not have); give the other model a name of its own, then migrate"))


def _read_on_both_branches(test_if: ast.AST, name: str) -> bool:
    """``if multi_gpus: net = DP(net) else: net = net.to(device)``: both branches read ``name``
    before anything binds it, so wherever it is unbound the original stops there already
    (NameError on either path): a wrap moved below the ``if`` reads it no more often."""

    def reads_first(stmts: List[ast.stmt]) -> bool:
        for st in stmts:
            if not isinstance(st, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)):
                return False  # a compound statement: not followed here
            read = st.value if not isinstance(st, ast.AugAssign) else st
            if read is not None and any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                                        for n in ast.walk(read)):
                return True
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(st)):
                return False  # bound before it is read
        return False

    return isinstance(test_if, ast.If) and bool(test_if.orelse) and reads_first(test_if.body) and reads_first(test_if.orelse)


def _other_branch(m: SemanticModel, a: ast.AST, b: ast.AST) -> Optional[ast.AST]:
    """The ``if`` whose one branch holds ``a`` and whose other holds ``b`` (they never both run
    in one pass), else ``None``."""
    around_a = {id(node): where for node, where in m.branches(a)}
    for node, where in m.branches(b):
        if isinstance(node, ast.If) and id(node) in around_a and {around_a[id(node)], where} == {"body", "orelse"}:
            return node
    return None


def _replaced(ctx: Context, w: Wrap) -> Optional[Finding]:
    """A layer of the wrapped model replaced after the wrap, then trained: DDP synchronises
    only the parameters it was built with (:func:`dp2ddp.model.rebound_wrappers.replaced_after_wrap`),
    also by a method of the model's class (:func:`~dp2ddp.model.rebound_wrappers.regrown_after_wrap`)."""
    m = ctx.m
    if w.stmt is None or w.target is None:
        return None
    grown = regrown_after_wrap(m, w.outer, w.module)
    if grown is not None:
        where = f"{grown.where}:" if grown.where else "line "
        change = grown.change
        return ctx.block(grown.call, "DDP117", (
            f"`{m.source(grown.call)[:60]}` changes the model's layers after it is wrapped (line {m.position(w.stmt)[0]}): "
            f"`{ast.unparse(change).splitlines()[0][:50]}` ({where}{change.lineno}); DistributedDataParallel keeps "
            "synchronising the parameters it was built with and the new ones would train apart on every rank; wrap the "
            "model again after each change (a progressive model: a new DistributedDataParallel per stage), by hand"))
    found = replaced_after_wrap(m, w.stmt, w.target, w.module)
    if found is None:
        return None
    text = m.source(found.stmt).strip().splitlines()[0][:60]
    return ctx.block(found.stmt, "DDP117", (
        f"`{text}` replaces a layer of the model after it is wrapped (line {m.position(w.stmt)[0]}), and it trains after "
        f"(line {m.position(found.use)[0]}): DistributedDataParallel keeps synchronising the parameters it was built with and "
        "the new ones train apart on every rank; replace the layer before the wrap, then migrate"))


PLACED_NOTE = ("; the module is placed on this rank's GPU at the wrap when CUDA is available, as DataParallel "
               "placed it on its one device (DistributedDataParallel moves nothing)")


def _in_place(ctx: Context, w: Wrap, inner_text: str, find_unused: bool, what: str,
              early: Optional[ast.stmt] = None) -> List[Finding]:
    """The DataParallel call replaced by DistributedDataParallel where it stands, the module
    placed on its device first where DataParallel placed it (or, ``early``, where a later
    ``.cuda()`` would come too late)."""
    m = ctx.m
    place = early is None and not w.functional and placed_by_dataparallel(m, w.stmt, w.module, w.target, w.outer)
    module_text = (cuda_first(ctx, inner_text) if early is not None
                   else placed_at_wrap(ctx, inner_text, w.module) if place else inner_text)
    return [ctx.note(w.call, "DDP100", what + early_note(m, early) + (PLACED_NOTE if place else ""),
                     [Replace(ctx.cst(w.outer), ctx.expr(ctx.ddp_call(module_text, find_unused, _cls(w), w.sync_bn)))])]


def _wrap_site(ctx: Context, w: Wrap, hoists, find_unused: bool) -> List[Finding]:
    m = ctx.m
    call, stmt, target = w.call, w.stmt, w.target
    inner_text = unwrapped_text(ctx, w)
    if stmt is None or not ctx.bridge.alone_on_line(stmt):
        return [ctx.block(call, "DDP101", "DataParallel inside a one-line compound statement; migrate this by hand")]
    if any(isinstance(a, LOOPS) for a in _ancestors_in_function(m, stmt)) and not fresh_each_pass(m, w):
        return [ctx.block(call, "DDP101", (
            "DataParallel wrap inside a loop, of a model that is not made in the same pass (or in the loop that "
            "trains it): DDP must wrap each model once, before training it; migrate this by hand"))]
    if wraps_a_part_of_its_module(m, target, stmt):
        return [ctx.block(call, "DDP101", "DataParallel wraps a sub-module inside an nn.Module; wrap the whole model where it is built instead")]
    by_caller = placed_by_caller(m, stmt, target) if target is not None else None
    if by_caller is not None:
        return [ctx.block(call, "DDP101", (
            f"the model this function returns after the wrap is placed on a device by its caller ({by_caller}: "
            f"`.{m.enclosing_function(stmt).name}().to(...)`): DistributedDataParallel must be built over a module already on "  # type: ignore[union-attr]
            "this rank's device, and that device is chosen there for the one process of the original; place the model "
            "before the wrap (on the rank's device), then migrate"))]
    partial_root = None
    if wraps_a_part(m, w):
        root = root_name(target)
        if root is not None and root.id == "self":
            if is_module_class(m, m.enclosing_class(stmt)):
                return [ctx.block(call, "DDP101", "DataParallel wraps a sub-module inside an nn.Module; wrap the whole model where it is built instead")]
            return [ctx.block(call, "DDP101", (
                f"DataParallel wraps `{m.source(target)}`, a part of `{m.source(target.value)}` (an attribute of an object "  # type: ignore[attr-defined]
                "that is no nn.Module): DistributedDataParallel must wrap the model whose forward runs, once, and the "
                "model's other trained parameters would not be synchronised; wrap the whole model where it is built, "
                "then migrate"))]
        elif root is not None:
            if not module_like(m, root.id):
                return [ctx.block(call, "DDP101", f"cannot tell whether {root.id} is the model; migrate this wrap by hand")]
            problem = parts_called_alone(m, w, root)
            if problem is not None:
                return [ctx.block(call, "DDP101", problem)]
            partial_root = root

    if not w.conditions and partial_root is None:
        early = None
        if target is not None:
            anchor = rewrapped_later(m, w) or absorb_placement(m, stmt, target, w.module)
            early = late_cuda(m, anchor, target, w.module, everywhere=True)
            late = placed_late(ctx, w, anchor, target) if early is None else None
            if late is not None:
                return [late]
            if anchor is not stmt:
                hoist = hoist_at(hoists, anchor, target)
                hoist.late_cuda = early
                hoist.place = early is None and not w.functional and placed_by_dataparallel(m, stmt, w.module, target, w.outer, until=anchor)
                hoist.cls = _cls(w)
                hoist.sync_bn = w.sync_bn
                edits = unwrap_in_place(ctx, w, inner_text, hoist)
                return [ctx.note(call, "DDP100", "DataParallel -> DistributedDataParallel, after the module is placed on its device"
                                 + early_note(m, early), edits)]
        return _in_place(ctx, w, inner_text, find_unused, "DataParallel -> DistributedDataParallel", early)

    beside = beside_own_ddp(m, w)
    if beside is not None and partial_root is None:
        # ``if opt['dist']: net = DDP(net) else: net = DataParallel(net)``: moved out of the
        # ``if``, the wrap would wrap the script's own DDP again on that path
        return _in_place(ctx, w, inner_text, find_unused, (
            f"DataParallel -> DistributedDataParallel on its own branch: the other branch of `if {m.source(beside.test)}:` "
            "wraps in DistributedDataParallel already (the script's own path), and a wrap after the `if` would wrap that "
            "one again"))
    earlier = wrapped_above(m, w) if partial_root is None else None
    if earlier is not None:
        # ``if args.convert_from: model = model.cpu().module; convert(model); model =
        # DataParallel(model)`` after the model's wrap above: moved below its ``if``, the
        # re-wrap would wrap that wrapper again on the path that skips it (CondenseNet's
        # checkpoints gained a second `module.`); on its own branch it re-wraps what it unwrapped
        return _in_place(ctx, w, inner_text, find_unused, (
            f"DataParallel -> DistributedDataParallel under its `if {m.source(w.conditions[-1].test)}:`: a re-wrap of "
            f"`{m.source(target)}`, wrapped already above (line {earlier.stmt.lineno}) on every path that reaches it, kept "
            "on its branch so that the path that skips the `if` keeps that one wrap"))
    if target is None:
        return [ctx.block(call, "DDP101", "DataParallel under a condition in a form dp2ddp cannot move out of it; migrate this by hand")]
    wrap_target = partial_root if partial_root is not None else target
    anchor = w.conditions[-1] if w.conditions else stmt
    if not ctx.bridge.alone_on_line(anchor):
        return [ctx.block(call, "DDP101", "DataParallel under a one-line condition; migrate this by hand")]
    anchor = absorb_placement(m, anchor, wrap_target, w.module if partial_root is None else None)
    cuda_guard = ran_on_every_gpu_machine(m, [c.test for c in w.conditions])  # it ran on every GPU machine
    early = late_cuda(m, anchor, wrap_target, w.module, everywhere=cuda_guard)
    late = placed_late(ctx, w, anchor, wrap_target) if early is None else None
    if late is not None:
        return [late]
    kept_under = None
    if (w.conditions and isinstance(wrap_target, ast.Name) and maybe_unbound(m, wrap_target.id, w.conditions[-1])
            and not _read_on_both_branches(w.conditions[-1], wrap_target.id)):
        # ``if cfg.eval_head: head = Head(model)`` before the wrap's ``if``: moved out of every
        # condition, the wrap would read an unbound ``head``; it stays under the test that made it
        held = [m.source(c.test) for c in binding_conditions(m, wrap_target.id, w.conditions[-1])]
        kept_under = next((c.test for c in w.conditions if m.source(c.test) in held), None)
        if kept_under is None:
            return [ctx.block(call, "DDP101", (
                f"`{wrap_target.id}` is bound only on some paths before `if {m.source(w.conditions[-1].test)}:` (line "
                f"{w.conditions[-1].lineno}): moved out of it so that every rank wraps, the wrap would read an unbound name "
                "where it is not; migrate this by hand"))]
    inside = _used_inside_after(m, w, wrap_target) if w.conditions else None
    unwrapped_inside: List[Finding] = []
    module_uses = _module_uses_inside_after(m, w, wrap_target) if inside is not None and partial_root is None else None
    if module_uses:
        # ``model = DP(model); optimizer = SGD(model.module.parameters())`` in the wrap's own
        # branch: ``DP(model).module`` is ``model`` itself, the bare module those lines keep
        # reading once the wrap moves below the ``if``
        for n in module_uses:
            unwrapped_inside.append(ctx.note(n, "DDP124", (
                f"`{m.source(n)}` -> `{m.source(n.value)}` under `if {m.source(w.conditions[-1].test)}:`: the wrap moves below "
                f"that `if`, and `{m.source(n.value)}` there is the bare module `.module` gave"),
                [Replace(ctx.cst(n), ctx.expr(m.source(n.value)))]))
        inside = None
    if inside is not None:
        return [ctx.block(inside, "DDP101", (
            f"DataParallel under `if {m.source(w.conditions[0].test)}:` would move below that `if` so that every rank wraps, "
            f"but `{m.source(inside)}` (line {m.position(inside)[0]}) uses the model inside it after the wrap, where it would "
            "still be the bare module (`.module` there fails); move those uses below the `if`, or migrate this by hand"))]
    unplaced = (early is None and not w.functional and partial_root is None
                and placed_by_dataparallel(m, stmt, w.module, wrap_target, w.outer, until=anchor)
                and not late_placements(m, anchor, wrap_target, w.module))
    hoist = hoist_at(hoists, anchor, wrap_target)
    hoist.guarded = bool(w.conditions)
    hoist.late_cuda = hoist.late_cuda or early
    # under a CUDA test the wrap ran on every GPU machine, and with one GPU DataParallel placed
    # the module: the migrated wrap places it too; under a device count it never did (below)
    hoist.place = hoist.place or (unplaced and cuda_guard)
    hoist.cls = hoist.cls or _cls(w)
    hoist.sync_bn = hoist.sync_bn or w.sync_bn
    hoist.kept_under = hoist.kept_under or kept_under
    edits = unwrap_in_place(ctx, w, inner_text, hoist)
    if w.conditions and any(isinstance(e, Remove) for e in edits):
        edits = drop_emptied_if(ctx, w, hoist) or edits
    if partial_root is not None:
        # (where another branch wraps the whole model, pytorch/examples' imagenet `features` of
        # alexnet and vgg, the migration's keys are that branch's: the original's on the others)
        saved = keys_saved(m, partial_root.id) if not wrapped_whole(m, partial_root.id) else None
        if saved is not None:
            part = m.source(target)[len(partial_root.id) + 1:]
            return [ctx.block(call, "DDP101", (
                f"partial DataParallel wrap of {m.source(target)}, and the state of {partial_root.id} is saved "
                f"(`{m.source(saved)[:60]}`, line {saved.lineno}): the original's saves hold `{part}.module.` keys; "
                f"wrapped whole in DistributedDataParallel, {partial_root.id} gives `module.{part}.` keys (and `.module` "
                f"gives `{part}.`), which the project's loaders of the original's checkpoints cannot load; migrate this "
                f"by hand (save `{partial_root.id}.module.state_dict()` with the `{part}.` keys renamed to `{part}.module.`)"))]
        msg = (
            f"partial DataParallel wrap of {m.source(target)}: the whole {partial_root.id} is wrapped once in "
            "DistributedDataParallel so that every trained parameter is averaged across ranks"
        )
        out = [ctx.note(call, "DDP102", msg + early_note(m, early), edits)]
        saved = keys_saved(m, partial_root.id)
        if saved is not None:
            # (the branch that wraps the whole model keeps its keys: the migration's are that branch's)
            part = m.source(target)[len(partial_root.id) + 1:]
            test = m.source(w.conditions[0].test) if w.conditions else ""
            out.append(ctx.warn(call, "DDP191", (
                f"where {m.source(target)} is wrapped{f' (`{test}`)' if test else ''}, the original saved `{part}.module.` "
                f"keys (`{m.source(saved)[:60]}`, line {saved.lineno}); the migration saves `module.{part}.` ones there, as "
                f"the branch that wraps the whole {partial_root.id} does: checkpoints of that path do not load across the "
                "two (a strict load fails); rename the keys once where that matters")))
        return out
    test = m.source(next(c for c in w.conditions if c.test is not kept_under).test)
    kept = (f"; it stays under `if {m.source(kept_under)}:`, the test {m.source(wrap_target)} is made under"
            if kept_under is not None else "")
    out = [ctx.note(call, "DDP103", f"DistributedDataParallel wrap moved out of `if {test}:` so that every rank wraps, also on CPU"
                    + kept + early_note(m, early) + (PLACED_NOTE if unplaced and cuda_guard else ""), edits)]
    count_guard = all(count_test(m, c.test) for c in w.conditions) and not cuda_guard
    # not in a project module: the script that calls it may place what it returns
    if (unplaced and count_guard and ctx.role != "helper" and not placed_anywhere(m, {m.source(wrap_target), m.source(w.module)})
            and not placed_by_maker(m, w.module)):
        out.append(ctx.warn(call, "DDP171", (
            f"{m.source(wrap_target)} is never placed on a GPU: its DataParallel runs only under `if {test}:`, where it "
            "would raise at the first forward with several GPUs (the parameters are not on cuda:0), so the original "
            "trains on the CPU; on a GPU machine the migration starts NCCL and DistributedDataParallel refuses the CPU "
            f"module at the wrap; place {m.source(wrap_target)} on its device (`.cuda()`, `.to(device)`) before the wrap")))
    return out + unwrapped_inside


def _flag_kept(ctx: Context, w: Wrap, find_unused: bool) -> List[Finding]:
    """``if parallel: model = DP(model)`` in a factory the caller controls: the wrap stays
    under the caller's flag, as DDP. A placement that follows (``if cuda: model =
    model.cuda()``) moves above it: DDP needs the parameters on their device when built."""
    m = ctx.m
    test = m.source(w.conditions[0].test)
    msg = f"DistributedDataParallel wrap kept under `if {test}:`, a flag of the caller; another wrap trains the model unconditionally"
    ddp = ctx.ddp_call(unwrapped_text(ctx, w), find_unused, _cls(w), w.sync_bn)
    cond = w.conditions[-1]
    target = w.target
    anchor = absorb_placement(m, cond, target, w.module) if target is not None else cond
    if anchor is cond:
        late = placed_late(ctx, w, cond, target) if target is not None else None
        return [late] if late is not None else [ctx.note(w.call, "DDP127", msg, [Replace(ctx.cst(w.outer), ctx.expr(ddp))])]
    if len(w.conditions) != 1 or cond.orelse or len(cond.body) != 1 or cond.body[0] is not w.stmt or not ctx.bridge.alone_on_line(cond):
        late = placed_late(ctx, w, cond, target)
        return [late] if late is not None else [ctx.block(w.call, "DDP101", "DataParallel under a flag, placed on its device after it; migrate this by hand")]
    moved = ctx.stmt("if {test}:\n    {t} = {call}\n", test=test, t=m.source(target), call=ddp)
    edits = [Remove(ctx.bridge.statement(cond)), InsertAfter(ctx.bridge.statement(anchor), (moved,))]
    return [ctx.note(w.call, "DDP127", msg + "; moved below the placement of the module on its device", edits)]


_PLACEMENT = frozenset({"cuda", "to", "cpu", "half", "float", "double", "bfloat16", "train", "eval"})


def _attribute_uses_after(m: SemanticModel, w: Wrap, target: ast.AST) -> Iterator[Tuple[ast.Attribute, bool]]:
    """The attributes of the model read inside the outermost ``if`` of the wrap, after the
    wrap (its placement and mode calls aside), with whether each is in the wrap's own branch;
    statements with a DataParallel of their own (the other branch's wrap) are skipped."""
    cond = w.conditions[-1]
    text = m.source(target)
    end = (w.stmt.end_lineno, w.stmt.end_col_offset)  # type: ignore[attr-defined]
    own = {id(s) for s in cond.body}  # type: ignore[attr-defined]
    for stmt in cond.body + cond.orelse:  # type: ignore[attr-defined]
        if any(isinstance(c, ast.Call) and "DataParallel" in (terminal(c.func) or "") for c in ast.walk(stmt)):
            continue  # another wrap (the other branch's own DataParallel)
        for n in ast.walk(stmt):
            if not (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and m.source(n.value) == text):
                continue
            if (n.lineno, n.col_offset) <= end or n.attr in _PLACEMENT:
                continue
            yield n, id(stmt) in own


def _used_inside_after(m: SemanticModel, w: Wrap, target: ast.AST) -> Optional[ast.AST]:
    """A use of the model inside the outermost ``if`` of the wrap, after the wrap, that a
    wrap moved below the ``if`` breaks: ``model.module`` (the wrapper's, but the model there
    is the bare module now), or an attribute of the model in the other branch (routed
    through ``.module`` as a use of the wrapper, yet it runs before the wrap)."""
    return next((n for n, own in _attribute_uses_after(m, w, target) if n.attr == "module" or not own), None)


def _module_uses_inside_after(m: SemanticModel, w: Wrap, target: ast.AST) -> Optional[List[ast.Attribute]]:
    """Every ``<target>.module`` read in the wrap's own branch after the wrap, when the wrap
    stands directly in that branch of its one ``if`` and the branch reads no other attribute
    of the model; else ``None``. (The other branch never held the wrapper: wrapper_refs
    leaves it as it is.)"""
    cond = w.conditions[-1]
    if len(w.conditions) != 1 or m.parent(w.stmt) is not cond or w.stmt not in cond.body:  # type: ignore[attr-defined]
        return None
    found: List[ast.Attribute] = []
    for n, own in _attribute_uses_after(m, w, target):
        if not own:
            continue
        if n.attr != "module":
            return None
        found.append(n)
    return found or None


def _ifexp_wrap(ctx: Context, ifexp: ast.IfExp, wraps: List[Wrap], find_unused: bool):
    """``m = DP(net).cuda() if cuda else DP(net)``: both branches wrap -> one DDP around the
    conditional; one branch wraps -> that branch unwrapped and a DDP wrap after the
    statement (the wrapper must exist on every path)."""
    m = ctx.m
    stmt = m.statement_of(ifexp)
    parent = m.parent(ifexp)
    target = parent.targets[0] if isinstance(parent, ast.Assign) and parent.value is ifexp and len(parent.targets) == 1 else None
    if not isinstance(target, (ast.Name, ast.Attribute)) or stmt is None or not ctx.bridge.alone_on_line(stmt):
        return [ctx.block(wraps[0].call, "DDP101", "DataParallel inside a conditional expression dp2ddp cannot rewrite; migrate this by hand")], [], False
    edits = [Replace(ctx.cst(w.outer), ctx.expr(unwrapped_text(ctx, w))) for w in wraps]
    both = {id(ifexp.body), id(ifexp.orelse)} == {id(w.outer) for w in wraps}
    if both:
        ddp = ctx.ddp_call("{inner}", find_unused, _cls(wraps[0]), any(w.sync_bn for w in wraps))
        edits.append(Replace(ctx.cst(ifexp), lambda u, ddp=ddp: cst.parse_expression(ddp.format(inner=cst.Module(body=[]).code_for_node(u)))))
        return [ctx.note(wraps[0].call, "DDP100", "DataParallel -> DistributedDataParallel around the conditional expression", edits)], assigned_keys(m, ifexp), False
    t = m.source(target)
    new = ctx.stmt("{t} = {call}", t=t, call=ctx.ddp_call(t, find_unused, _cls(wraps[0]), any(w.sync_bn for w in wraps)))
    edits.append(InsertAfter(ctx.bridge.statement(stmt), (new,)))
    return [ctx.note(wraps[0].call, "DDP103", f"DistributedDataParallel wrap of {t} after the conditional expression, so that every rank wraps", edits)], assigned_keys(m, ifexp), True


def _ancestors_in_function(m: SemanticModel, stmt: ast.AST):
    for a in m.ancestors(stmt):
        if isinstance(a, FUNCTIONS + (ast.ClassDef, ast.Lambda, ast.Module)):
            return
        yield a


def _rebase(ctx: Context) -> List[Finding]:
    """``class MyDataParallel(nn.DataParallel)`` that adds only what means the same on
    DDP (``__getattr__`` falling through to ``.module``, ``state_dict``): its base becomes
    DistributedDataParallel, and its calls are migrated like DataParallel's."""
    out = []
    for cls, why in dp_subclasses(ctx.m).values():
        if why is None:
            edits = [Replace(ctx.cst(b), ctx.expr(ctx.name("DDP"))) for b in cls.bases]
            out.append(ctx.note(cls, "DDP100", f"class {cls.name} derives from DistributedDataParallel instead of "
                                               "DataParallel (it adds only what means the same there)", edits))
    return out


def _cls(w: Wrap) -> Optional[str]:
    """The name the migrated wrap calls where the original called the script's own
    DataParallel subclass (rebased on DistributedDataParallel by :func:`_rebase`)."""
    return w.cls.name if w.cls is not None else None
