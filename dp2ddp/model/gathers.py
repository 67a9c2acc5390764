"""Gathers with gradients whose backward does not sum over the ranks.

A contrastive loss computed on every rank's embeddings gathers them with an autograd
``Function`` (``GatherLayer``): ``forward`` runs ``dist.all_gather``, and ``backward`` must
hand each rank the gradient of its own slice summed over every rank's loss (each rank
computes the whole loss from the gathered batch). A backward that returns this rank's slice
of its own gradients (``return grads[dist.get_rank()]``) without an ``all_reduce`` (or
``reduce_scatter``) first keeps 1/world of it; DDP then averages what is left, so every
gradient through the gather is 1/world of the one process's: a silent change of the learning
rate (Adam hides most of it, SGD does not). :func:`unsummed_gathers` finds such a class in
the script and in the project modules it imports.
"""

from __future__ import annotations

import ast
import os
from typing import List, Optional, Tuple

from dp2ddp.model.core import SemanticModel

_FUNCTION = frozenset({"torch.autograd.Function", "torch.autograd.function.Function"})
_SUMS = frozenset({"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all"})


def unsummed_gather(m: SemanticModel, cls: ast.ClassDef) -> Optional[int]:
    """The line of ``cls``'s ``backward`` when ``cls`` is such a gather, else ``None``."""
    if not any(m.is_name(b, _FUNCTION) for b in cls.bases):
        return None
    methods = m.methods(cls)
    fwd, bwd = methods.get("forward"), methods.get("backward")
    if fwd is None or bwd is None:
        return None
    gathers = any(isinstance(n, ast.Call) and any(q.startswith("torch.distributed") and q.endswith(".all_gather")
                                                  for q in m.qualified_names(n.func)) for n in ast.walk(fwd))
    if not gathers:
        return None
    for n in ast.walk(bwd):
        if isinstance(n, ast.Call):
            name = n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id if isinstance(n.func, ast.Name) else ""
            if name in _SUMS:
                return None
    # ``grads[dist.get_rank()]`` (returned, or copied into ``grad_out[:]`` first): this rank's slice
    for n in ast.walk(bwd):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) and "rank" in m.source(n.slice).lower():
            return n.lineno
    return None


def unsummed_gathers(m: SemanticModel) -> List[Tuple[ast.AST, str]]:
    """``(node of the script, "path:line")``: each such gather of the script (its class) or
    of a project module it imports, directly or through others (the script's import that
    leads there)."""
    from dp2ddp.model.module_files import module_file
    from dp2ddp.model.project_defs import file_model
    from dp2ddp.project import project_modules, reached_modules

    got = m.cache.get("gathers:unsummed")
    if got is not None:
        return got  # type: ignore[return-value]
    out: List[Tuple[ast.AST, str]] = []
    for cls in m.nodes(ast.ClassDef):
        line = unsummed_gather(m, cls)
        if line is not None:
            out.append((cls, f"line {line}"))
    if m.path not in ("<string>", "<stdin>", "-") and os.path.exists(m.path):
        base = os.path.dirname(os.path.abspath(m.path))
        mods = project_modules(m.path, m.tree)
        bad = {}
        for real, (rel, _depth) in mods.items():
            pm = file_model(real)
            if pm is None:
                continue
            for cls in pm.nodes(ast.ClassDef):
                line = unsummed_gather(pm, cls)
                if line is not None:
                    bad.setdefault(real, f"{rel}:{line}")
        for imp in (n for n in m.tree.body if isinstance(n, (ast.Import, ast.ImportFrom))) if bad else ():
            names = [a.name for a in imp.names] if isinstance(imp, ast.Import) else \
                [imp.module or ""] + [f"{imp.module}.{a.name}" if imp.module else a.name for a in imp.names]
            level = imp.level if isinstance(imp, ast.ImportFrom) else 0
            for name in names:
                found = module_file(base, name, level) if name else None
                if found is None:
                    continue
                reach = reached_modules(found)
                hit = next((bad[r] for r in bad if r in reach), None)
                if hit is not None:
                    out.append((imp, hit))
                    break
    m.cache["gathers:unsummed"] = out
    return out
