"""The shape of a training step's batch: where the step reads it as a whole.

* :func:`batch_value`: ``e`` is (a part of) a batch the loop iterates: its target, an item
  of it (``data[0]``, ``batch["img"]``), moved or retyped (``.to(device)``, ``.cuda()``,
  ``.float()``), or a name the loop binds to one of those.
* :func:`fixed_reshapes`: a batch reshaped by sizes it does not read from itself
  (few-shot episodes: ``data.view(ep_per_batch, way, shot + query, *img_shape)``, in the
  loop or in a project function the batch is handed to). A DataLoader sharded sample by
  sample gives each rank part of every batch, and such a view of a part fails, or cuts
  episodes in two: the loader can only be shared out whole batch by whole batch
  (``--keep-batch-size``).
* :func:`written_batch_shares`: a file written from a batch a training loop iterates (an
  image grid of the real samples, dcgan's ``real_samples.png``): under DDP each rank holds
  its share of that batch, and the write, on rank 0 only, holds rank 0's.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.steps import own_nodes

# calls that hand back the value they are given, on another device or in another type
_SAME_ROWS = frozenset({"to", "cuda", "cpu", "float", "half", "double", "bfloat16", "type", "contiguous", "detach",
                        "clone", "requires_grad_"})
_RESHAPES = frozenset({"view", "reshape"})


def batch_value(m: SemanticModel, e: ast.AST, loop: ast.AST, depth: int = 0) -> bool:
    """``e`` is (a part of) a batch the loop iterates: its target, an item of it
    (``data[0]``, ``batch["img"]``), moved or retyped (``.to(device)``, ``.cuda()``,
    ``.float()``), or a name the loop binds to one of those."""
    e = _rows_of(e)
    if isinstance(e, (ast.ListComp, ast.GeneratorExp)) and len(e.generators) == 1 and depth <= 6:
        # ``image1, image2, flow = [x.cuda() for x in data_blob]``: the batch's items, moved
        g = e.generators[0]
        item = _rows_of(e.elt)
        if isinstance(g.target, ast.Name) and isinstance(item, ast.Name) and item.id == g.target.id and not g.ifs:
            return batch_value(m, g.iter, loop, depth + 1)
        return False
    if not isinstance(e, ast.Name) or depth > 6:
        return False
    target = getattr(loop, "target", None)
    if target is not None and any(isinstance(n, ast.Name) and n.id == e.id for n in ast.walk(target)):
        return True
    for n in reversed(own_nodes(m, loop)):  # the last assignment before the use
        if isinstance(n, ast.Assign) and n.lineno < e.lineno and any(
            isinstance(t, ast.Name) and t.id == e.id for tgt in n.targets for t in ast.walk(tgt)
        ):
            return batch_value(m, n.value, loop, depth + 1)
    return False


def _rows_of(e: ast.AST) -> ast.AST:
    """What ``e`` holds the rows of: ``data[0]``, ``img.data``, ``x.cuda()`` -> the value itself."""
    while True:
        if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant):
            e = e.value
        elif isinstance(e, ast.Attribute) and e.attr == "data":  # old code: img.data
            e = e.value
        elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in _SAME_ROWS:
            e = e.func.value
        else:
            return e


def fixed_reshapes(m: SemanticModel) -> List[Tuple[ast.AST, ast.Call, str]]:
    """``(training loop, the reshape, where it stands)`` for each reshape of a step's batch by
    sizes it does not read from itself (no ``-1``, no ``size``/``shape``/``len`` in its
    leading size), in the loop or in a function of the project the batch is handed to."""
    from dp2ddp.model.project_defs import project_def
    from dp2ddp.model.training import training_loops

    got = m.cache.get("batch_shapes:fixed")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.AST, ast.Call, str]] = []
    for loop in training_loops(m):
        sized = _size_names(m.enclosing_function(loop) or m.tree)
        for n in own_nodes(m, loop):
            if not isinstance(n, ast.Call):
                continue
            if _fixed(n, sized) and batch_value(m, n.func.value, loop):  # type: ignore[attr-defined]
                out.append((loop, n, f"line {n.lineno}"))
                continue
            for i, a in enumerate(n.args):
                if isinstance(a, ast.Starred) or not batch_value(m, a, loop):
                    continue
                found = project_def(m, n.func) if isinstance(n.func, (ast.Name, ast.Attribute)) else None
                if found is None or not isinstance(found[1], (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                pm, func, rel = found
                params = [p.arg for p in func.args.posonlyargs + func.args.args]
                if i >= len(params):
                    continue
                shaped = _param_reshape(func, params[i])
                if shaped is not None:
                    out.append((loop, shaped, f"{rel}:{shaped.lineno}"))
    m.cache["batch_shapes:fixed"] = out
    return out


def _reads_size(e: ast.AST) -> bool:
    return any(isinstance(x, ast.Attribute) and x.attr in ("size", "shape") or
               isinstance(x, ast.Name) and x.id == "len" for x in ast.walk(e))


def _size_names(scope: ast.AST) -> frozenset:
    """Names ``scope`` binds to a read of a size (``b = x.size(0)``, ``n, c = x.shape[:2]``)."""
    out = set()
    for n in ast.walk(scope):
        if isinstance(n, ast.Assign) and _reads_size(n.value):
            out.update(t.id for tgt in n.targets for t in ast.walk(tgt) if isinstance(t, ast.Name))
    return frozenset(out)


def _fixed(call: ast.Call, sized: frozenset = frozenset()) -> bool:
    """``x.view(a, b, c)`` / ``x.reshape((a, b))`` whose sizes do not read the tensor's own
    (``sized``: names bound to a read of a size)."""
    f = call.func
    if not (isinstance(f, ast.Attribute) and f.attr in _RESHAPES) or not call.args or call.keywords:
        return False
    sizes = call.args
    if len(sizes) == 1 and isinstance(sizes[0], (ast.Tuple, ast.List)):
        sizes = sizes[0].elts
    if len(sizes) < 2 or isinstance(sizes[0], ast.Starred):
        return False
    for s in sizes:
        if isinstance(s, ast.UnaryOp) and isinstance(s.op, ast.USub):
            return False  # -1: the size is inferred from the tensor
    lead = sizes[0]
    return not _reads_size(lead) and not any(isinstance(x, ast.Name) and x.id in sized for x in ast.walk(lead))


def _param_reshape(func: ast.AST, param: str) -> Optional[ast.Call]:
    """A fixed reshape of ``param`` (moved or retyped) in ``func``, where ``param`` is not
    bound again first."""
    sized = _size_names(func)
    for n in ast.walk(func):
        if isinstance(n, ast.Call) and _fixed(n, sized):
            v = n.func.value  # type: ignore[attr-defined]
            while isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in _SAME_ROWS:
                v = v.func.value
            if isinstance(v, ast.Name) and v.id == param:
                return n
    return None


def batch_sized_objects(m: SemanticModel, batch: Optional[ast.AST]) -> List[Tuple[ast.Call, str]]:
    """Objects built with a training loader's batch size as their batch: a call of a class
    (the script's, a project module's, or one whose name is capitalised) that passes
    ``batch`` (the loader's ``batch_size`` expression, or a name bound to the same
    expression) to a parameter named for the batch (``Yolo_loss(device=device,
    batch=config.batch // config.subdivisions)``, whose grids are made for that many
    images). A DataLoader sharded sample by sample hands each rank a part of every batch,
    and such an object still expects the whole one: ``(call, parameter)``. DataLoaders and
    samplers, which the loader migration shards, are not such objects."""
    from dp2ddp.model.names import DATALOADER
    from dp2ddp.model.project_defs import class_of_call, project_def

    if batch is None or isinstance(batch, ast.Constant):
        return []
    text = ast.unparse(batch)
    same = {text}
    for a in m.nodes(ast.Assign):  # ``bs = config.batch // config.subdivisions``: the name is the same value
        if len(a.targets) == 1 and isinstance(a.targets[0], ast.Name) and ast.unparse(a.value) == text:
            same.add(a.targets[0].id)
    if isinstance(batch, ast.Name):
        for b in m.bindings_of(batch):
            if b.kind == "assign" and b.value is not None:
                same.add(ast.unparse(b.value))
    out: List[Tuple[ast.Call, str]] = []
    for call in m.nodes(ast.Call):
        if m.call_is(call, DATALOADER) or any(q.startswith("torch.utils.data.") for q in m.qualified_names(call.func)):
            continue
        name = call.func.attr if isinstance(call.func, ast.Attribute) else call.func.id if isinstance(call.func, ast.Name) else ""
        params: List[str] = []
        found = class_of_call(m, call)
        if found is not None and _data_class(found[0], found[1]):
            continue  # a Sampler or Dataset of the project's: the loader's own batches, which the migration shards
        if found is not None:
            init = found[0].methods(found[1]).get("__init__")
            if init is not None:
                params = [p.arg for p in init.args.posonlyargs + init.args.args][1:]
        elif not name[:1].isupper() or project_def(m, call.func) is not None or name.endswith(_DATA_CLASSES):
            continue
        for i, a in enumerate(call.args):
            if i < len(params) and "batch" in params[i].lower() and ast.unparse(a) in same:
                out.append((call, params[i]))
        for k in call.keywords:
            if k.arg and "batch" in k.arg.lower() and ast.unparse(k.value) in same:
                out.append((call, k.arg))
    return out


_DATA_CLASSES = ("Sampler", "Dataset", "DataLoader", "Loader")


def _data_class(cm: SemanticModel, cls: ast.ClassDef) -> bool:
    """A class that derives from torch's ``Sampler``/``Dataset``/``DataLoader`` (or is named
    for one): it makes the loader's batches, which the loader migration shards whole."""
    for b in cls.bases:
        if any(q.startswith("torch.utils.data.") for q in cm.qualified_names(b)):
            return True
        if ast.unparse(b).endswith(_DATA_CLASSES):
            return True
    return cls.name.endswith(_DATA_CLASSES)


def batch_size_tests(m: SemanticModel, batch_size: Optional[ast.AST]) -> List[ast.Compare]:
    """Comparisons of a batch's size with the loader's ``batch_size`` expression (not a
    constant): ``now_batch_size, c, h, w = inputs.shape`` then ``if now_batch_size <
    opt.batchsize: continue`` (layumi's Person_reID_baseline skipping a short last batch). A
    rank's share of a batch is smaller than the batch size, so such a test would hold, or
    fail, on every step."""
    if batch_size is None or isinstance(batch_size, ast.Constant):
        return []
    text = ast.unparse(batch_size)
    sized: dict = {}  # the size names of each function, read once
    out = []
    for c in m.nodes(ast.Compare):
        sides = [c.left, *c.comparators]
        if len(sides) != 2:
            continue
        texts = [ast.unparse(x) for x in sides]
        if text not in texts:
            continue
        other = sides[1] if texts[0] == text else sides[0]
        scope = m.enclosing_function(c) or m.tree
        if id(scope) not in sized:
            sized[id(scope)] = _size_names(scope)
        if _reads_size(other) or (isinstance(other, ast.Name) and other.id in sized[id(scope)]):
            out.append(c)
    return out


def written_batch_shares(m: SemanticModel, stmt: ast.AST) -> List[Tuple[ast.Call, ast.AST]]:
    """``(write, argument)`` for each file write in ``stmt`` (``save_image(real, path)``,
    ``torch.save(batch, path)``, ``np.save``: :func:`dp2ddp.model.writers.writers`' saves)
    whose argument is (part of) the batch the innermost training loop around it iterates
    (:func:`batch_value`)."""
    from dp2ddp.model.training import training_loops
    from dp2ddp.model.writers import writers

    around = [lp for lp in training_loops(m) if m.contains(lp, stmt)]
    loop = next((lp for lp in around if not any(o is not lp and m.contains(lp, o) for o in around)), None)
    if loop is None:
        return []
    out: List[Tuple[ast.Call, ast.AST]] = []
    for w in writers(m):
        if w.kind != "save" or not (w.call is stmt or m.contains(stmt, w.call)):
            continue
        arg = next((a for a in w.call.args if batch_value(m, a, loop)), None)
        if arg is not None:
            out.append((w.call, arg))
    return out
