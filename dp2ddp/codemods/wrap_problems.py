"""The refusals of the DataParallel migration, checked before any transform runs
(:func:`problems`, called by :func:`dp2ddp.migrate.plan`): DataParallel used in a way that
cannot be migrated (an alias, a subclass, an argument, a sub-module wrapped inside an
``nn.Module``), one forward feeding two backward passes, parameters replaced after the
wrap (DDP117), a training forward through ``.module`` that DDP would not synchronise
(DDP167)."""

from __future__ import annotations

import ast
from typing import List, Optional, Set

from dp2ddp.codemods.context import Context
from dp2ddp.engine import Finding, InsertAfter, Replace
from dp2ddp.model.collectives import var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.kinds import wraps_a_part_of_its_module
from dp2ddp.model.names import DDP as DDP_NAMES
from dp2ddp.model.uses import dp_wrapper_keys, dp_wrapper_uses
from dp2ddp.model.sync_bn import dp_library
from dp2ddp.model.wraps import dp_other_refs, dp_subclasses, dp_wraps


def problems(ctx: Context) -> List[Finding]:
    """Uses of DataParallel that cannot be migrated at all (checked before anything else)."""
    m = ctx.m
    out: List[Finding] = []
    if not dp_wraps(m) and dp_library(m):
        # the synchronized-BatchNorm package's own module: its DataParallel subclass and patchers
        # are understood where a script calls them; alone there is nothing to migrate
        ref = next(iter(dp_other_refs(m)), None) or m.tree.body[0]
        return [ctx.block(ref, "DDP116", (
            "the synchronized-BatchNorm package's DataParallel (a subclass that adds replication callbacks, or a "
            "patcher of replicas): nothing here wraps a model; the scripts that use it migrate with their helpers "
            "(`dp2ddp rewrite train.py --with-helpers`), where its calls become DistributedDataParallel with SyncBatchNorm"))]
    subclass_of = {id(b): why for c, why in dp_subclasses(m).values() if why is not None for b in c.bases}
    for ref in dp_other_refs(m):
        if id(ref) in subclass_of:
            out.append(ctx.block(ref, "DDP101", f"{subclass_of[id(ref)]}; migrate this subclass by hand"))
            continue
        out.append(ctx.block(ref, "DDP101", "DataParallel is used indirectly (alias, subclass or argument); migrate this by hand"))
    for w in dp_wraps(m):
        if w.problem:
            out.append(ctx.block(w.call, "DDP101", f"{w.problem}; left unchanged"))
        elif not w.functional and wraps_a_part_of_its_module(m, w.target, w.call):
            out.append(ctx.block(w.call, "DDP101", "DataParallel wraps a sub-module inside an nn.Module; wrap the whole model where it is built instead"))
    out.extend(_shared_forward(ctx))
    out.extend(_replaced_after_wrap(ctx))
    out.extend(_forward_through_module(ctx))
    out.extend(_data_parallel_attributes(ctx))
    out.extend(_dtype_after_wrap(ctx))
    out.extend(_second_order(ctx))
    return out


def step_decided_by_the_loss(ctx: Context) -> List[Finding]:
    """An optimizer step under a test of the loss (``if is_valid_number(loss.item()):
    optimizer.step()``). Under DDP each rank tests the loss of its own share: one may step
    where another skips, and the replicas part for good. Where the test reads the loss once,
    where every rank evaluates it, the read goes through ``loss_of_every_rank(...)`` (the
    ranks' losses all-reduced and averaged: every rank tests one value, the whole batch's,
    DDP181); else refused (DDP180). Checked once the mode is known: a script with its own
    distributed path keeps its own decisions."""
    from dp2ddp.model.steps import loss_decided_skips, loss_decided_steps

    m = ctx.m
    if (not dp_wraps(m) and ctx.role != "helper") or ctx.mode != "plain":
        # (a script with its own distributed path decides its steps as its authors run it under
        # DDP; a helper migrated with the entry steps the model the entry wraps: SRFBN's solver)
        return []
    out: List[Finding] = []
    name = None
    for step, test, read, loss in loss_decided_steps(m):
        what = (f"`{m.source(read)}`, the loss" if m.source(read) == m.source(loss) else
                f"`{m.source(read)}`, computed from the loss `{m.source(loss)}`")
        cond = " ".join(m.source(test.test).split())[:60]
        if not _one_value_to_test(m, test, read, loss):
            out.append(ctx.block(step, "DDP180", (
                f"`{m.source(step)}` runs only if `{cond}` (line {test.lineno}), a test of {what}: under DDP each rank tests "
                "the loss of its own share of the batch, so one rank may step where another skips and the replicas part for "
                "good, and dp2ddp cannot make every rank test one value here (the test reads it more than once, only on some "
                "paths, or reads a value computed from it); test a value every rank agrees on (the loss all-reduced, as the original's one process saw "
                "it), then migrate")))
            continue
        name = name or _loss_of_every_rank(ctx)
        out.append(ctx.note(read, "DDP181", (
            f"`{m.source(step)}` runs only if `{cond}` (line {test.lineno}), a test of {what}: every rank tests the ranks' "
            f"losses averaged ({name}, an all-reduce), the whole batch's as in the original, so every rank steps or skips "
            "alike"), [Replace(ctx.cst(read), lambda u: ctx.expr(f"{name}({{x}})", x=u))]))
    for skip, test, read, loss in loss_decided_skips(m):
        cond = " ".join(m.source(test.test).split())[:60]
        what = "skips" if isinstance(skip, ast.Continue) else "leaves the loop before"
        if not _one_value_to_test(m, test, read, loss):
            out.append(ctx.block(skip, "DDP180", (
                f"`{m.source(skip)}` {what} the backward pass if `{cond}` (line {test.lineno}), a test of the loss: under DDP "
                "each rank tests the loss of its own share of the batch, and a rank that skips its backward leaves the others "
                "waiting in the gradient all-reduce (gloo stops, NCCL hangs); dp2ddp cannot make every rank test one value "
                "here; test a value every rank agrees on (the loss all-reduced), then migrate")))
            continue
        name = name or _loss_of_every_rank(ctx)
        out.append(ctx.note(read, "DDP181", (
            f"`{m.source(skip)}` {what} the backward pass if `{cond}` (line {test.lineno}), a test of the loss: every rank "
            f"tests the ranks' losses averaged ({name}, an all-reduce), the whole batch's as in the original, so every rank "
            "skips or goes backward alike (a rank that skipped alone would leave the others waiting in the all-reduce)"),
            [Replace(ctx.cst(read), lambda u: ctx.expr(f"{name}({{x}})", x=u))]))
    out.extend(_handed_to_a_loss_decided_step(ctx))
    return out


def _one_value_to_test(m, test: ast.If, read: ast.AST, loss: ast.AST) -> bool:
    """The test reads the loss once, on every path, as the loss itself, and no loss kept from
    an earlier step: every rank can test the ranks' losses averaged (DDP181)."""
    return _read_by_every_rank(m, test, read) and _the_loss_itself(m, read, loss) and not _kept_from_the_loss(m, test, read, loss)


def _loss_of_every_rank(ctx: Context) -> str:
    """The name of ``loss_of_every_rank(value)``, written into the module (once: the caller keeps the name)."""
    name = ctx.fresh_name("loss_of_every_rank")
    ctx.define_after_imports("loss_of_every_rank.py.tmpl", loss_of_every_rank=name, dist=ctx.name("dist"), torch=ctx.name("torch"))
    return name


def _handed_to_a_loss_decided_step(ctx: Context) -> List[Finding]:
    """The wrapped model handed to a project class or function whose step a test of the
    loss decides (SRFBN's ``SRSolver.train_step``: ``if loss_batch < self.skip_threshold *
    self.last_epoch_loss: self.optimizer.step()``): that module is not rewritten for it (it
    holds no DataParallel), so each rank would test its own share's loss there. DDP180 at
    the call that hands the model over."""
    from dp2ddp.model.project_defs import project_calls, reach_across
    from dp2ddp.model.steps import loss_decided_steps

    m = ctx.m
    keys = dp_wrapper_keys(m)
    out: List[Finding] = []
    for call, (pm, node, rel) in project_calls(m):
        handed = [a for a in [*call.args, *(k.value for k in call.keywords)]
                  if any(isinstance(x, (ast.Name, ast.Attribute)) and var_key(m, x) in keys for x in ast.walk(a))]
        if not handed:
            continue
        run = list(reach_across(pm, node, rel))
        if isinstance(node, ast.ClassDef):  # an object that keeps the model: its methods are called later
            run += [(pm, fn, rel) for c in pm.family(node) for fn in pm.methods(c).values()]
        for mod, fn, path in run:
            found = next(((st, t) for st, t, _r, _l in loss_decided_steps(mod) if mod.contains(fn, st)), None)
            if found is None:
                continue
            step, test = found
            cond = " ".join(mod.source(test.test).split())[:60]
            out.append(ctx.block(call, "DDP180", (
                f"`{m.source(handed[0])}` is handed to {m.source(call.func)}(), whose `{mod.source(step)}` ({path}:{step.lineno}) "
                f"runs only if `{cond}` (line {test.lineno}), a test of the loss: under DDP each rank tests the loss of its own "
                "share of the batch, so one rank may step where another skips and the replicas part for good; test a value "
                "every rank agrees on there (the loss all-reduced, as the original's one process saw it), then migrate")))
            break
    return out


_SAME_NUMBER = frozenset({"item", "detach", "data", "cpu", "float", "clone", "double"})


def _the_loss_itself(m, read: ast.AST, loss: ast.AST) -> bool:
    """``read`` is the loss, or a name bound only to the loss's value (``value =
    loss.item()``, ``float(loss)``, ``loss.detach()``): averaged over the ranks it is the
    whole batch's. Not a value computed from it (``done = i + 1 if loss.item() < 10 else 0``)."""
    if m.source(read) == m.source(loss):
        return True
    _, bindings = m.lookup(read.id, m.scope_of(read))  # type: ignore[attr-defined]
    if not bindings:
        return False
    for b in bindings:
        v = b.value if b.kind == "assign" else None
        while v is not None and not (isinstance(v, ast.Name) and v.id == getattr(loss, "id", None)):
            if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in _SAME_NUMBER and not v.args:
                v = v.func.value
            elif isinstance(v, ast.Attribute) and v.attr in _SAME_NUMBER:
                v = v.value
            elif isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "float" and len(v.args) == 1:
                v = v.args[0]
            else:
                v = None
        if v is None:
            return False
    return True


def _kept_from_the_loss(m, test: ast.If, read: ast.AST, loss: ast.AST) -> bool:
    """The test also reads an attribute that keeps a loss (``loss_batch < self.skip_threshold
    * self.last_epoch_loss`` with ``self.last_epoch_loss = loss_batch``, SRFBN's solver): each
    rank's own share's, so the ranks' thresholds part even when they test one value."""
    names = {getattr(read, "id", None), getattr(loss, "id", None)} - {None}
    attrs = {a.attr for a in ast.walk(test.test) if isinstance(a, ast.Attribute)}
    for n in m.nodes(ast.Assign):
        if any(isinstance(t, ast.Attribute) and t.attr in attrs for t in n.targets) and any(
                isinstance(x, ast.Name) and x.id in names for x in ast.walk(n.value)):
            return True
    return False


def _read_by_every_rank(m, test: ast.If, read: ast.AST) -> bool:
    """``read`` is the only read of its name in the test, and nothing between it and the
    test's root can skip it (``and``/``or``, ``x if c else y``, a lambda or comprehension)."""
    reads = [n for n in ast.walk(test.test) if isinstance(n, ast.Name) and n.id == getattr(read, "id", None)]
    if len(reads) != 1:
        return False
    node = m.parent(read)
    while node is not None and node is not test:
        if isinstance(node, (ast.BoolOp, ast.IfExp, ast.Lambda, ast.comprehension, ast.ListComp, ast.GeneratorExp,
                             ast.SetComp, ast.DictComp, ast.NamedExpr)):
            return False
        node = m.parent(node)
    return node is test


def _second_order(ctx: Context) -> List[Finding]:
    """DDP174: a backward pass that may build a graph of the gradients (``create_graph``) in
    a script that trains the wrapped model. DDP's gradient hooks all-reduce during the first
    backward; the second-order gradients through it are not synchronised across ranks (torch
    warns: "not well-supported"), and its reducer may reject the double backward altogether."""
    from dp2ddp.model.steps import input_penalties, second_order
    from dp2ddp.model.training import training_site

    m = ctx.m
    if not dp_wraps(m) or training_site(m) is None:
        return []
    return [ctx.block(call, "DDP174", (
        f"`{m.source(call)[:70]}` may build a graph of the gradients (create_graph) for a second derivative: "
        "DistributedDataParallel all-reduces the first-order gradients in its hooks and does not synchronise "
        "higher-order ones across ranks (torch: \"not well-supported\"; it can also fail outright), so the replicas would "
        "train apart; keep DataParallel for this script, or migrate its second-order step by hand"))
        for call in second_order(m)] + [ctx.block(call, "DDP174", (
            f"`{m.source(call)[:70]}` builds a graph of the gradient with respect to an input (a gradient penalty), "
            "whose backward runs through the model's parameters again: DistributedDataParallel expects that backward to "
            "give every parameter of the forward a gradient, and a penalty's reaches only some (a last layer's bias gets "
            "none), so the next forward fails (\"Expected to have finished reduction in the prior iteration\"), with "
            "find_unused_parameters too; keep DataParallel for this script, or migrate its penalty step by hand "
            "(StyleGAN2-ADA all-reduces such gradients itself)"))
        for call in input_penalties(m)]


# conversions that give the parameters new storage of another dtype (``.float()`` leaves a
# float32 model as it is, and is not one)
_DTYPE_METHODS = frozenset({"half", "double", "bfloat16"})
_DTYPES = frozenset({f"torch.{t}" for t in ("float16", "half", "bfloat16", "float64", "double")})


def _dtype_conversion(m: SemanticModel, use) -> Optional[ast.Call]:
    """The call that converts the dtype of the wrapper's parameters at ``use``
    (``model.half()``, ``model.module.to(torch.float16)``), if it is one."""
    attr = m.parent(use.node)
    if use.kind == "module":
        attr = m.parent(attr)
    elif use.kind != "api":
        return None
    call = m.parent(attr) if isinstance(attr, ast.Attribute) else None
    if not isinstance(call, ast.Call) or call.func is not attr:
        return None
    if attr.attr in _DTYPE_METHODS:  # type: ignore[union-attr]
        return call
    if attr.attr in ("to", "type"):  # type: ignore[union-attr]
        args = list(call.args) + [k.value for k in call.keywords if k.arg in ("dtype", "dst_type")]
        if any(m.qualified_names(a) & _DTYPES for a in args if isinstance(a, (ast.Name, ast.Attribute))):
            return call
    return None


def _dtype_after_wrap(ctx: Context) -> List[Finding]:
    """``model.half()`` (``.double()``, ``.to(torch.float16)``) on the wrapper after the wrap:
    DataParallel replicated the converted model at every forward, but DDP built its gradient
    buckets for the parameters' dtype when it was made, and after the conversion the ranks'
    gradients are no longer averaged (measured: the replicas drifted apart, exit 0). A
    conversion in the wrap's own function, a statement of its own on the wrapper's name
    (``if args.half: model.half()``, akamaster's CIFAR ResNets), is followed by a new wrap of
    the converted module (DDP129): DDP built again registers the parameters as they now are
    (measured: replicas in sync; the optimizer holds the same parameter objects). Anywhere
    else it is refused."""
    m = ctx.m
    wraps = [w for w in dp_wraps(m) if not w.functional and w.stmt is not None]
    out: List[Finding] = []
    for use in dp_wrapper_uses(m):
        call = _dtype_conversion(m, use)
        if call is None:
            continue
        func = m.enclosing_function(use.node)
        after = [w for w in wraps if w.function is not func or m.position(use.node) > m.end_position(w.stmt)]
        if not (len(after) == len(wraps) and wraps):
            continue
        if _rebound_since_wrap(m, use.node, wraps):
            continue  # ``model = Bert.from_pretrained(out_dir)`` after the training: a bare model of its own
        rewrap = _rewrap_after(ctx, use, call, wraps)
        if rewrap is not None:
            out.append(rewrap)
        else:
            return [ctx.block(call, "DDP101", (
                f"`{m.source(call)}` converts the model's dtype after the DataParallel wrap (line {wraps[0].stmt.lineno}): "
                "DistributedDataParallel builds its gradient buckets for the dtype the parameters have when it is "
                "made, and after the conversion the ranks' gradients would not be averaged (the replicas drift apart); "
                "convert the model before the wrap, then migrate"))]
    return out


def _rebound_since_wrap(m: SemanticModel, holder: ast.AST, wraps) -> bool:
    """The name ``holder`` reads is bound to something other than a wrap between the last
    wrap of its function and ``holder`` (SpanBERT's test phase loads a fresh model under the
    same name): it holds that value, not the wrapper."""
    if not isinstance(holder, ast.Name):
        return False
    func = m.enclosing_function(holder)
    ends = [m.end_position(w.stmt) for w in wraps if w.function is func]
    if not ends:
        return False
    wrap_stmts = {id(w.stmt) for w in wraps}
    for b in m.bindings_of(holder):
        stmt = m.statement_of(b.node)
        if stmt is None or id(stmt) in wrap_stmts or m.enclosing_function(stmt) is not func:
            continue
        if max(ends) < m.position(stmt) < m.position(holder):
            return True
    return False


def _rewrap_after(ctx: Context, use, call: ast.Call, wraps) -> Optional[Finding]:
    """The new wrap after ``model.half()`` (see :func:`_dtype_after_wrap`), or None where the
    conversion is not a statement of its own on the name that holds the wrapper, in the
    function of its wraps."""
    from dp2ddp.codemods.find_unused import needs_find_unused

    m = ctx.m
    stmt = m.statement_of(call)
    holder = use.node
    target_ok = isinstance(holder, ast.Name) or (isinstance(holder, ast.Attribute) and isinstance(holder.value, ast.Name)
                                                 and holder.value.id == "self")
    plain = (isinstance(stmt, ast.Expr) and stmt.value is call) or (
        isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and stmt.value is call
        and m.source(stmt.targets[0]) == m.source(holder))
    func = m.enclosing_function(call)
    if not (target_ok and plain and all(w.function is func for w in wraps) and ctx.bridge.alone_on_line(stmt)):
        return None
    text = m.source(holder)
    find_unused = needs_find_unused(ctx, wraps, [])
    new = ctx.stmt("{t} = {call}", t=text, call=ctx.ddp_call(ctx.module_of(text), find_unused))
    return ctx.note(call, "DDP129", f"`{m.source(call)}` changes the parameters' dtype after the wrap: the module is "
                    "wrapped again right after it, so that DistributedDataParallel averages the gradients of the "
                    "converted parameters", [InsertAfter(ctx.bridge.statement(stmt), (new,))])


# attributes of the DataParallel object itself (not of the model it wraps) whose values mean
# something else under DDP: the GPUs one process split its batches over
DP_OWN_ATTRS = frozenset({"device_ids", "output_device", "src_device_obj"})


def _data_parallel_attributes(ctx: Context) -> List[Finding]:
    """``len(model.device_ids)``: the number of GPUs DataParallel split each batch over. The
    DDP wrapper's ``device_ids`` is this process's one device (``None`` on CPU), and the
    model has none: no reading of it keeps the original's value, so the file is refused."""
    m = ctx.m
    for use in dp_wrapper_uses(m):
        if use.kind == "attribute" and use.attr in DP_OWN_ATTRS:
            return [ctx.block(m.parent(use.node), "DDP101", (
                f"`{m.source(m.parent(use.node))}` reads DataParallel's own `{use.attr}` (the GPUs this one process split "
                "each batch over): under DDP each process drives one device (DistributedDataParallel's `device_ids` is "
                "that one, or None on CPU) and the model has no such attribute; replace it with what it stands for "
                "(`torch.cuda.device_count()`, or 1 per process with the batch divided), then migrate"))]
    return []


def _forward_through_module(ctx: Context) -> List[Finding]:
    """DDP167: the loss of a backward pass computed by a forward through ``.module``
    (:mod:`dp2ddp.model.module_bypass`): DDP would not average its gradients."""
    from dp2ddp.model.module_bypass import bypassing_forwards

    m = ctx.m
    out = []
    for b in bypassing_forwards(m, dp_wrapper_keys(m)):
        text = m.source(b.call.func)
        out.append(ctx.block(b.call, "DDP167", (
            f"`{text}(...)` runs the bare model, around the wrapper, and the backward pass at line {b.backward.lineno} "
            "differentiates its result: DistributedDataParallel averages the gradients only of a forward through the "
            "wrapper itself, so each rank would keep the gradients of its own share and the replicas drift apart; call "
            "the wrapper (`model(x)`), making the method the model's `forward` if it is one, then migrate")))
    return out


def trained_outside_wrap(ctx: Context) -> List[Finding]:
    """DDP119: a module trained or updated beside the wrapped model, not inside its wrap
    (:mod:`dp2ddp.model.outside_wrap`). Checked last, by :func:`dp2ddp.migrate.plan`, when
    nothing else refused the file (a refusal about the wrap itself says more)."""
    from dp2ddp.model.outside_wrap import trained_outside_wrap as found

    m = ctx.m
    out = []
    for u in found(m):
        text = m.brief(u.module)
        made = m.position(u.made)[0]
        if u.what == "parameters":
            how = (f"its parameters are trained by the optimizer at {u.place}, but it is not inside "
                   "the DataParallel wrap: DistributedDataParallel averages only the wrapped module's gradients, so each "
                   f"rank would train its own copy of `{text}` on its share and the copies drift apart")
            fix = "make it a sub-module of the wrapped model or wrap it in DataParallel too, then migrate"
        else:
            buffer = u.what.split(" ", 1)[1]
            how = (f"its buffer `{buffer}` is changed in place ({u.place}) from what the training step feeds it, "
                   "outside the DataParallel wrap: under "
                   "DistributedDataParallel each rank would update its own copy from its share only, and the copies drift apart")
            fix = "gather what updates it from every rank first (torch.distributed.all_gather) and migrate by hand"
        out.append(ctx.block(u.made, "DDP119", f"`{text}` ({u.cls}, line {made}): {how}; {fix}"))
    return out


_REPLACING = {"resize_token_embeddings", "resize_position_embeddings", "prune_heads", "reset_classifier"}


def _replacing_methods(m: SemanticModel) -> Set[str]:
    """Method names that replace parameters: HF's ``resize_token_embeddings`` and
    friends, and methods of this module's classes that assign a new layer or parameter to
    ``self`` outside ``__init__``."""
    out = set(_REPLACING)
    for cls in m.classes.values():
        for name, meth in m.methods(cls).items():
            if name == "__init__":
                continue
            for node in ast.walk(meth):
                if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" for t in node.targets
                ):
                    v = node.value
                    if isinstance(v, ast.Call) and any(q.startswith("torch.nn.") for q in m.qualified_names(v.func)):
                        out.add(name)
    return out


def _replaced_after_wrap(ctx: Context) -> List[Finding]:
    """``model.resize_token_embeddings(n)`` after the model is wrapped: DataParallel
    replicates the module on every forward and sees the new parameters; DDP keeps
    synchronising the ones it was built with, and the new ones train apart."""
    m = ctx.m
    names = _replacing_methods(m)
    wraps = [w.stmt for w in dp_wraps(m) if not w.functional and w.stmt is not None]
    wraps += [m.statement_of(c) for c in m.calls(DDP_NAMES)]
    out = []
    for call in m.nodes(ast.Call):
        f = call.func
        if not (isinstance(f, ast.Attribute) and f.attr in names):
            continue
        func = m.enclosing_function(call)
        for w in wraps:
            if w is not None and m.enclosing_function(w) is func and (w.lineno, w.col_offset) < (call.lineno, call.col_offset):
                out.append(
                    ctx.block(
                        call,
                        "DDP117",
                        f"{f.attr}() replaces parameters after the model is wrapped (line {w.lineno}): DistributedDataParallel "
                        "keeps synchronising the parameters it was built with and the new ones train apart; call it before the wrap",
                    )
                )
                break
    return out


_CUT = {"detach", "item", "data", "cpu", "numpy", "tolist"}


def _uses_tainted(expr: ast.AST, tainted: Set[str]) -> bool:
    """``expr`` reads a tainted name other than through ``.detach()``/``.item()``/``.data``."""
    todo = [expr]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Attribute) and n.attr in _CUT:
            continue
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _CUT:
            continue
        if isinstance(n, ast.Name) and n.id in tainted:
            return True
        todo.extend(ast.iter_child_nodes(n))
    return False


def _exclusive(m, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` stand on different branches of one ``if`` (body and ``else``/``elif``):
    the innermost ``if`` that holds both decides."""
    for node in m.ancestors(a):
        if isinstance(node, ast.If) and m.contains(node, b):
            def in_body(x: ast.AST, body=node.body) -> bool:
                return any(s is x or m.contains(s, x) for s in body)
            return in_body(a) != in_body(b)
    return False


def _shared_forward(ctx: Context) -> List[Finding]:
    """One forward of a wrapped model whose output feeds two or more ``.backward()`` calls
    in the same loop (pix2pixHD: the generator and discriminator losses of one forward):
    DDP marks each parameter ready once per forward, so this cannot be migrated as it is."""
    m = ctx.m
    keys = dp_wrapper_keys(m)
    if not keys:
        return []
    out = []
    done = set()
    for use in dp_wrapper_uses(m):
        if use.kind != "forward":
            continue
        call = m.parent(use.node)
        loops = m.enclosing_loops(call)
        if not loops or id(loops[0]) in done:
            continue
        loop = loops[0]
        key = var_key(m, call.func)
        # each forward's outputs are followed up to the next forward of the same model in the
        # loop (a GAN's discriminator runs on real, fake and interpolated images in turn)
        until = min((c.lineno for c in m.calls_in(loop) if c.lineno > call.lineno and var_key(m, c.func) == key),
                    default=float("inf"))
        stmt = m.statement_of(call)
        tainted: Set[str] = set()
        if isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                tainted |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        if not tainted:
            continue
        backwards = []
        # in the order they run: an assignment from the outputs taints its names, one from
        # anything else clears them (``d_loss = lambda_gp * penalty`` is another loss)
        events = sorted([s for s in ast.walk(loop) if isinstance(s, ast.Assign) and s is not stmt
                         and stmt.lineno < s.lineno < until]
                        + [c for c in m.calls_in(loop) if isinstance(c.func, ast.Attribute) and c.func.attr == "backward"
                           and stmt.lineno <= c.lineno < until], key=lambda n: (n.lineno, n.col_offset))
        for e in events:
            if isinstance(e, ast.Assign):
                names = {n.id for t in e.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                if _uses_tainted(e.value, tainted):
                    tainted |= names
                elif all(isinstance(t, ast.Name) for t in e.targets):
                    tainted -= names
            elif _uses_tainted(e.func.value, tainted):
                backwards.append(e)
        # backward passes on the exclusive branches of one ``if``/``elif`` chain never run together
        backwards = next(([a, b] for i, a in enumerate(backwards) for b in backwards[i + 1:] if not _exclusive(m, a, b)), [])
        if len(backwards) >= 2:
            done.add(id(loop))
            lines = ", ".join(str(b.lineno) for b in backwards)
            out.append(
                ctx.block(
                    call,
                    "DDP101",
                    f"one forward of {m.source(use.node)} feeds {len(backwards)} backward passes (lines {lines}): "
                    "DistributedDataParallel synchronises each parameter once per forward; split the forward per "
                    "loss (or wrap the parts separately) and migrate by hand",
                )
            )
    return out


def steered_by_shard(ctx: Context) -> List[Finding]:
    """DDP128: a scheduler stepped on a sum of what this rank's training batches gave
    (:mod:`dp2ddp.model.shard_steering`). Checked last, with DDP119."""
    from dp2ddp.model.shard_steering import steered_by_shard as found

    m = ctx.m
    out = []
    for s in found(m):
        if isinstance(s.sink, ast.If):
            test = " ".join(m.source(s.sink.test).split())[:60]
            out.append(ctx.block(s.sink, "DDP128", (
                f"`if {test}:` stops the training on `{s.name}`, which the training loop adds up (or collects) from this rank's own "
                f"batches (line {m.position(s.added)[0]}): under DDP each rank's value differs, so the ranks would stop at "
                "different epochs and the others would wait for them in their next all-reduce; all-reduce it over the ranks "
                "before the test, or stop on a value every rank computes alike (a validation loss over the whole set), "
                "then migrate")))
            continue
        sink = " ".join(m.source(s.sink).split())[:60]
        out.append(ctx.block(s.sink, "DDP128", (
            f"`{sink}` steps the scheduler on `{s.name}`, which the training loop adds up (or collects) from this rank's own batches "
            f"(line {m.position(s.added)[0]}): under DDP each rank's value differs from the others' and from the original's "
            "(which saw every batch), so the ranks would change their learning rate apart; all-reduce it over the ranks "
            "before the step (averaged or added up, as its terms need), or step on a value every rank computes alike "
            "(a validation loss over the whole set), then migrate")))
    return out
