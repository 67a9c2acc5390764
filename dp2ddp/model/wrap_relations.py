"""How a DataParallel wrap relates to the script's other wraps of the same model, and to the
model itself: a part of a model wrapped (``model.features = DP(model.features)``) and whether
the whole can be wrapped instead; a name wrapped again later, or already above; a wrap beside
the script's own DistributedDataParallel; a wrap the caller switches on; a name that holds a
model; a model's state saved. Facts of :mod:`dp2ddp.model`; ``codemods/wrap_ddp`` asks them
at each wrap site."""

from __future__ import annotations

import ast
from typing import List, Optional

from dp2ddp.model.collectives import VarKey, assigned_keys, var_key
from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import DDP, SAVE
from dp2ddp.model.syntax import root_name
from dp2ddp.model.wraps import Wrap, dp_wraps

MODULE_LIKE_ATTRS = {"parameters", "named_parameters", "to", "cuda", "train", "eval", "state_dict", "load_state_dict", "zero_grad"}


def wrapped_keys(m: SemanticModel, w: Wrap) -> List[VarKey]:
    """The variables that hold the wrapper after ``w``: its target's, or, for a wrap of a part
    of a model, the whole model's name."""
    target = w.target
    if target is None:
        return []
    if wraps_a_part(m, w):
        root = target
        while isinstance(root, ast.Attribute):
            root = root.value
        k = var_key(m, root)
        return [k] if k is not None else []
    return assigned_keys(m, w.outer)


def wraps_a_part(m: SemanticModel, w: Wrap) -> bool:
    """``model.features = DP(model.features)``: a part of a model is wrapped (not
    ``self.model = DP(self.model)``, which wraps the whole of ``self.model``)."""
    t = w.target
    return (
        isinstance(t, ast.Attribute)
        and not (isinstance(t.value, ast.Name) and t.value.id == "self")
        and w.module is not None
        and m.source(t) == m.source(w.module)
    )


def parts_called_alone(m: SemanticModel, w: Wrap, root: ast.Name) -> Optional[str]:
    """``model.features = DP(model.features)`` migrates as a wrap of the whole ``model``
    (pytorch/examples' AlexNet and VGG): right where the script runs the whole model's
    forward. Not where it wraps several parts of it, or calls a part itself
    (``model.embeds(x)``, ``model.head(model.body(x))``): that forward would bypass the
    wrapper, and the parts' gradients would go unsynchronised."""
    func = m.enclosing_function(w.call)
    scope = func if func is not None else m.tree
    others = [o for o in dp_wraps(m) if o is not w and o.target is not None and wraps_a_part(m, o)
              and root_name(o.target) is not None and root_name(o.target).id == root.id
              and m.enclosing_function(o.call) is func]
    if others:
        return (f"DataParallel wraps several parts of `{root.id}` (lines {w.call.lineno}, "
                f"{', '.join(str(o.call.lineno) for o in others)}): DistributedDataParallel wraps one model whose forward "
                "runs, once; wrap the whole model where it is built, then migrate")
    for n in ast.walk(scope):
        if _calls_a_part(n, root.id) and n.lineno > w.call.lineno:
            return (f"DataParallel wraps `{m.source(w.target)}`, a part of `{root.id}`, and the script calls "
                    f"`{m.source(n.func)}` itself (line {n.lineno}): wrapped whole, that forward would bypass "
                    "DistributedDataParallel and the parts' gradients would go unsynchronised; wrap the whole model and "
                    "call it, then migrate")
    return None


# nn.Module's own methods the script may call on the whole model after a part's wrap: those
# that tell a name holds a model (MODULE_LIKE_ATTRS), and more
_WRAPPER_METHODS = frozenset(MODULE_LIKE_ATTRS | {"cpu", "modules", "named_modules", "children", "buffers", "named_buffers",
                                                  "apply", "float", "half", "double", "requires_grad_", "register_buffer"})


def _calls_a_part(n: ast.AST, root: str) -> bool:
    """``model.embeds(x)``, ``model.body.head(x)``: a part of the model called (not one of
    nn.Module's own methods, ``model.parameters()``, ``model.features.cuda()``)."""
    if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)) or n.func.attr in _WRAPPER_METHODS:
        return False
    owner = root_name(n.func)
    return owner is not None and owner.id == root and (isinstance(n.func.value, ast.Attribute) or bool(n.args or n.keywords))


def caller_flag(m: SemanticModel, w: Wrap) -> bool:
    """The wrap's only condition is a bare parameter of its function (``def build(...,
    parallel=False): if parallel: ...``): the caller chooses whether to wrap."""
    func = w.function
    if len(w.conditions) != 1 or func is None or not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    test = w.conditions[0].test
    return isinstance(test, ast.Name) and test.id in m.params(func)


def module_like(m: SemanticModel, name: str) -> bool:
    for call in m.nodes(ast.Call):
        f = call.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == name and f.attr in MODULE_LIKE_ATTRS:
            return True
    return False


def beside_own_ddp(m, w: Wrap) -> Optional[ast.If]:
    """The ``if`` around the wrap whose other branch assigns the same target a
    DistributedDataParallel of the script's own (``if opt['dist']: net = DDP(net) else: net =
    DataParallel(net)``, KAIR's ``model_to_device``); ``None`` where there is none."""
    if w.target is None or w.stmt is None:
        return None
    want = m.source(w.target)
    for c in w.conditions:
        if not isinstance(c, ast.If):
            continue
        other = c.orelse if any(m.contains(b, w.stmt) or b is w.stmt for b in c.body) else c.body
        for stmt in other:
            for n in ast.walk(stmt):
                if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and m.call_is(n.value, DDP)
                        and any(m.source(t) == want for t in n.targets)):
                    return c
    return None


def wrapped_whole(m, root: str) -> bool:
    """Some DataParallel wrap of the module wraps the model named ``root`` itself
    (``model = nn.DataParallel(model)``), not a part of it."""
    return any(w.module is not None and m.source(w.module) == root for w in dp_wraps(m))


def keys_saved(m, root: str) -> Optional[ast.AST]:
    """The save that writes the state of the model named ``root``: a ``torch.save`` whose
    object holds ``root`` or ``root.state_dict()`` (through dicts, lists and the names that
    hold them: ``best = copy.deepcopy(model.state_dict())`` kept in memory is no save), or
    ``root`` handed to a call that names saving or checkpoints (``save_model(model, opt,
    path)``)."""
    from dp2ddp.model.checkpoints import saved_parts
    from dp2ddp.model.flow import origins

    def holds(e: ast.AST) -> bool:
        for n in ast.walk(e):
            if isinstance(n, ast.Name) and n.id == root:
                return True
        return False

    for node in m.nodes(ast.Call):
        f = node.func
        if m.is_name(f, SAVE):
            for part in saved_parts(m, node):
                if holds(part) or (isinstance(part, ast.Name) and any(
                        o is not part and holds(o) for o, path in origins(m, part) if not path)):
                    return node
            continue
        name = (m.source(f).rsplit(".", 1)[-1]).lower()
        if ("save" in name or "checkpoint" in name) and any(
                isinstance(a, ast.Name) and a.id == root for a in list(node.args) + [k.value for k in node.keywords]):
            return node
    return None


def wrapped_above(m: SemanticModel, w: Wrap) -> Optional[Wrap]:
    """An unconditional wrap of the same name in the same block before the ``if`` around
    ``w`` (or a conditional one whose ``if`` ends before it: moved below its own ``if``, it
    is unconditional in the migration), the name read between (else
    :func:`rewrapped_later` makes the two one wrap): ``w`` re-wraps a model the script
    has wrapped already on every path that reaches its ``if``. ``None`` where there is none."""
    if w.target is None or w.stmt is None or not w.conditions:
        return None
    text = m.source(w.target)
    outer = w.conditions[-1]
    func = m.enclosing_function(w.stmt)
    for e in dp_wraps(m):
        if e is w or e.target is None or e.stmt is None or m.source(e.target) != text or m.enclosing_function(e.stmt) is not func:
            continue
        if wraps_a_part(m, e):
            continue
        anchor = e.conditions[-1] if e.conditions else e.stmt
        if m.parent(anchor) is not m.parent(outer) or (anchor.lineno, anchor.col_offset) >= (outer.lineno, outer.col_offset):
            continue
        if not e.conditions and rewrapped_later(m, e) is not None:
            continue  # (that one moves below this ``if`` and becomes this wrap: no re-wrap)
        if e.conditions and not wrapped_on_every_branch(m, e.conditions[-1], text.split(".")[0]):
            continue  # (``if test_only: ... net = DataParallel(net) ... sys.exit()``: not on this path)
        return e
    return None


def wrapped_on_every_branch(m: SemanticModel, test: ast.If, root: str) -> bool:
    """Both branches of ``test`` wrap ``root`` (or a part of it) in DataParallel, at their
    own level (CondenseNet's ``if alexnet or vgg: model.features = DataParallel(...)
    else: model = DataParallel(model)``): below the ``if``, ``root`` is wrapped whichever ran."""
    def wraps_in(block) -> bool:
        return any(e.stmt in block and e.target is not None and m.source(e.target).split(".")[0] == root
                   for e in dp_wraps(m))

    return bool(test.orelse) and wraps_in(test.body) and wraps_in(test.orelse)


def rewrapped_later(m: SemanticModel, w: Wrap) -> Optional[ast.stmt]:
    """Where an unconditional wrap goes when the same name is wrapped again under a later
    condition (SiamMask: ``dist_model = DataParallel(model)``, then ``if args.resume: model =
    restore_from(...); dist_model = DataParallel(model)``): the conditional wrap moves below
    its ``if`` so that every rank wraps, and this one, moved there too, becomes the same one
    wrap (not a DDP of a DDP on the path that skips the ``if``). ``None`` where there is no
    such later wrap, or the name is read between the two (it must be the wrapper there)."""
    from dp2ddp.model.wrap_placement import absorb_placement
    if w.target is None or w.stmt is None:
        return None
    text = m.source(w.target)
    func = m.enclosing_function(w.stmt)
    for later in dp_wraps(m):
        if (later is w or not later.conditions or later.target is None or m.source(later.target) != text
                or m.enclosing_function(later.stmt) is not func):
            continue
        guard = later.conditions[-1]
        if (guard.lineno, guard.col_offset) <= (w.stmt.lineno, w.stmt.col_offset) or m.contains(guard, w.stmt):
            continue
        if m.parent(guard) is not m.parent(w.stmt):
            continue  # not in the same block: the paths between cannot be read as one
        between = [n for n in ast.walk(func or m.tree) if isinstance(n, ast.Name) and n.id == text.split(".")[0]
                   and isinstance(n.ctx, ast.Load) and (w.stmt.end_lineno or 0) < n.lineno < guard.lineno]
        # read inside the ``if`` before the re-wrap (``model.load_state_dict(ckpt)`` of `module.`
        # keys, ``model = model.module``): the wrapper there, which a moved wrap would not be yet
        inside = [n for n in ast.walk(guard) if isinstance(n, ast.Name) and n.id == text.split(".")[0]
                  and isinstance(n.ctx, ast.Load) and (n.lineno, n.col_offset) < (later.stmt.lineno, later.stmt.col_offset)
                  and not m.contains(later.stmt, n)]
        if between or inside:
            return None
        return absorb_placement(m, guard, later.target, later.module)
    return None


def key_flags(m: SemanticModel, w: Wrap, flag_kept: bool = False) -> tuple:
    """``(guarded, flagged, cuda)``: what the original's ``state_dict`` keys of the model ``w``
    wraps were, for :func:`dp2ddp.model.checkpoint_keys.key_policy`. ``guarded``: the wrap ran
    only under a count of the devices (one GPU or the CPU wrote plain keys), unless every
    branch of that test wraps; ``cuda``: that test also holds with CUDA alone (``module.`` keys
    on every GPU machine); ``flagged``: under a device test the user switches (``if
    args.parallel:``, the run being migrated had it on). ``flag_kept``: the migration keeps the
    caller's switch (a factory's ``parallel`` argument), so the keys follow the caller."""
    from dp2ddp.model.cuda_only import count_test, device_test, ran_on_every_gpu_machine

    if w.target is None:
        return False, False, False
    counted = [c for c in w.conditions if count_test(m, c.test)]
    # ``if device_count() > 1: DataParallel(model) else: DataParallel(model, device_ids=None)``:
    # wrapped whichever ran, so the original's keys are `module.` ones on every machine
    everywhere = bool(counted) and all(wrapped_on_every_branch(m, c, m.source(w.target).split(".")[0]) for c in counted)
    if counted and not flag_kept and not everywhere:
        return True, False, ran_on_every_gpu_machine(m, [c.test for c in w.conditions])
    if w.conditions and not everywhere and any(device_test(m, c.test) for c in w.conditions):
        return False, True, False
    return False, False, False
