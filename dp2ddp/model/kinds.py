"""What kind of object a value or a class is, where a transform must tell a tensor from a
module:

* :func:`is_tensor`: a value made by a tensor method (``x.clone()``) or a ``torch.*``
  factory (``torch.zeros_like(X)``), never a ``torch.nn`` class;
* :func:`is_module_class`: a class of this module derived from ``nn.Module``.
"""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import MODULE_BASES

# methods only a tensor has (a module's ``.to()``/``.cuda()``/``.float()`` return the module)
TENSOR_METHODS = frozenset({"clone", "detach", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "uniform_",
                            "normal_", "zero_", "fill_", "view", "reshape", "permute", "contiguous", "unsqueeze", "squeeze"})


def is_tensor(m: SemanticModel, expr: ast.AST) -> bool:
    """``expr`` is a tensor, not a module: made by a tensor method (``x.clone()``), or a
    name every binding of which is one or a ``torch.*`` factory (``torch.zeros_like(X)``),
    never a ``torch.nn`` class."""
    from dp2ddp.model.flow import origins

    def made(n: ast.AST) -> bool:
        if not isinstance(n, ast.Call):
            return False
        if isinstance(n.func, ast.Attribute) and n.func.attr in TENSOR_METHODS:
            return True
        names = m.qualified_names(n.func)
        return bool(names) and all(q.startswith("torch.") and not q.startswith(("torch.nn.", "torch.hub", "torch.load", "torch.jit"))
                                   for q in names)

    if made(expr):
        return True
    if not isinstance(expr, ast.Name):
        return False
    got = origins(m, expr)
    return bool(got) and all(made(n) for n, _ in got)


def is_module_class(m: SemanticModel, cls: Optional[ast.ClassDef]) -> bool:
    """``cls`` derives from ``nn.Module`` by one of its bases (``False`` for ``None``)."""
    if cls is None:
        return False
    return any(m.is_name(b, MODULE_BASES) for b in cls.bases)
