"""Random numbers a training step draws per sample, outside the model.

DataParallel runs one process: a GAN's ``noise = torch.randn(b_size, nz, 1, 1)`` in the
training loop draws one vector per item of the global batch, and the scatter hands each
replica its rows. Under DDP every rank runs that line with its own share's ``b_size``,
from a random stream seeded alike on every rank: each rank draws the *same* vectors, and
the global batch holds world-size copies of half the noise (measured on the resumed DCGAN
of the survey: the losses leave the original's by more than per-rank BatchNorm explains).

:func:`per_sample_draws` finds, in each training loop of the module (the loop's own
statements, not the model's forward: a draw inside ``forward`` ran on every replica under
DataParallel too), the calls of ``torch.randn``/``rand``/``randint`` whose first size
dimension is the size of a value the step makes (``x.size(0)``, ``x.shape[0]``,
``len(x)``, or a name bound to one of them in the loop). The migration then draws the
whole global batch's rows on every rank from the same stream, and keeps this rank's
(``codemods/rank_noise.py``): each rank's rows are the original's, the streams stay
alike on every rank (so random choices that steer control flow still agree), and nothing
else changes.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import List, Optional, Set

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.flow import origins
from dp2ddp.model.steps import own_nodes
from dp2ddp.model.training import training_loops

# the draws whose size the migration can read: ``randn(*size)``, ``rand(*size)``, ``randint([low,] high, size)``
_DRAWS = ("torch.randn", "torch.rand", "torch.randint")


@dataclass(frozen=True)
class Draw:
    call: ast.Call  # the draw, e.g. ``torch.randn(b_size, nz, 1, 1, device=device)``
    count: ast.AST  # its first size dimension, the per-sample count (``b_size``)
    loop: ast.AST  # the training loop whose step draws it


def per_sample_draws(m: SemanticModel) -> List[Draw]:
    got = m.cache.get("noise:draws")
    if got is None:
        got, seen = [], set()
        for loop in training_loops(m):
            bound = _bound_in(m, loop)
            for n in own_nodes(m, loop):
                if isinstance(n, ast.Call) and id(n) not in seen:
                    count = _count(m, n)
                    if count is not None and _per_step(m, count, bound):
                        seen.add(id(n))
                        got.append(Draw(n, count, loop))
        m.cache["noise:draws"] = got
    return got  # type: ignore[return-value]


def _count(m: SemanticModel, call: ast.Call) -> Optional[ast.AST]:
    """The first size dimension of a draw, where the call spells it plainly."""
    q = m.qualified_names(call.func) & set(_DRAWS)
    if not q or any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    size = next((k.value for k in call.keywords if k.arg == "size"), None)
    if size is None:
        if q == {"torch.randint"}:  # randint(high, size) / randint(low, high, size)
            size = call.args[-1] if len(call.args) in (2, 3) else None
        elif call.args:
            size = call.args[0]
            if not isinstance(size, (ast.Tuple, ast.List)):  # randn(n, c, h, w)
                return size
    if isinstance(size, (ast.Tuple, ast.List)) and size.elts and not isinstance(size.elts[0], ast.Starred):
        return size.elts[0]
    return None


def _bound_in(m: SemanticModel, loop: ast.AST) -> Set[str]:
    """Names the loop binds: its target and every assignment among its own statements."""
    names: Set[str] = set()
    for n in own_nodes(m, loop):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            names.add(n.id)
    return names


def _size_of_step_value(m: SemanticModel, e: ast.AST, bound: Set[str]) -> bool:
    """``x.size(0)``, ``x.size()[0]``, ``x.shape[0]``, ``len(x)`` of a name the loop binds."""
    target = None
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "size":
        if len(e.args) == 1 and isinstance(e.args[0], ast.Constant) and e.args[0].value == 0 and not e.keywords:
            target = e.func.value
    elif isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and e.slice.value == 0:
        v = e.value
        if isinstance(v, ast.Attribute) and v.attr == "shape":
            target = v.value
        elif isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr == "size" and not v.args:
            target = v.func.value
    elif isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "len" and len(e.args) == 1:
        if m.qualified_names(e.func) <= {"len", "builtins.len"}:
            target = e.args[0]
    while isinstance(target, ast.Subscript):  # data[0].size(0)
        target = target.value
    return isinstance(target, ast.Name) and target.id in bound


def _per_step(m: SemanticModel, count: ast.AST, bound: Set[str]) -> bool:
    if _size_of_step_value(m, count, bound):
        return True
    if isinstance(count, ast.Name) and count.id in bound:
        made = origins(m, count)
        return bool(made) and all(not path and _size_of_step_value(m, node, bound) for node, path in made)
    return False
