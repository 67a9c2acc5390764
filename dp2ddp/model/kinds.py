"""What kind of object a value or a class is, where a transform must tell a tensor from a
module:

* :func:`is_tensor`: a value made by a tensor method (``x.clone()``) or a ``torch.*``
  factory (``torch.zeros_like(X)``), never a ``torch.nn`` class;
* :func:`is_module_class`: a class of this module derived from ``nn.Module``;
* :func:`without_parameters`: a module that has no parameters at all (a ``torch.nn`` loss,
  activation, pooling or dropout layer), which DistributedDataParallel refuses to wrap.
"""

from __future__ import annotations

import ast
from typing import Optional

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import MODULE_BASES

# methods only a tensor has (a module's ``.to()``/``.cuda()``/``.float()`` return the module)
TENSOR_METHODS = frozenset({"clone", "detach", "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor", "uniform_",
                            "normal_", "zero_", "fill_", "view", "reshape", "permute", "contiguous", "unsqueeze", "squeeze"})


# torch.nn classes whose instances hold no parameter whatever their arguments (buffers such
# as CrossEntropyLoss's ``weight`` are no parameters); not the containers, not PReLU, not
# AdaptiveLogSoftmaxWithLoss
_NO_PARAMETERS = frozenset(
    [f"{kind}Loss" for kind in ("BCE", "BCEWithLogits", "CTC", "CosineEmbedding", "CrossEntropy", "GaussianNLL", "HingeEmbedding",
                                "Huber", "KLDiv", "L1", "MarginRanking", "MSE", "MultiLabelMargin", "MultiLabelSoftMargin",
                                "MultiMargin", "NLL", "PoissonNLL", "SmoothL1", "SoftMargin", "TripletMargin",
                                "TripletMarginWithDistance")]
    + ["NLLLoss2d", "CELU", "ELU", "GELU", "GLU", "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh", "LeakyReLU", "LogSigmoid",
       "LogSoftmax", "Mish", "RReLU", "ReLU", "ReLU6", "SELU", "SiLU", "Sigmoid", "Softmax", "Softmax2d", "Softmin", "Softplus",
       "Softshrink", "Softsign", "Tanh", "Tanhshrink", "Threshold", "Identity", "Flatten", "Unflatten", "Upsample",
       "UpsamplingBilinear2d", "UpsamplingNearest2d", "PixelShuffle", "PixelUnshuffle", "CosineSimilarity", "PairwiseDistance",
       "AlphaDropout", "FeatureAlphaDropout"]
    + [f"Dropout{d}" for d in ("", "1d", "2d", "3d")]
    + [f"{p}{d}" for p in ("MaxPool", "AvgPool", "AdaptiveAvgPool", "AdaptiveMaxPool", "LPPool", "FractionalMaxPool")
       for d in ("1d", "2d", "3d")]
)
# methods of ``nn.Module`` that return the module they are called on (``model.cuda()``,
# ``.to(device)``, ``.eval()``, ``.apply(init)``): the one list every reader of the model uses
SAME_MODULE = frozenset({"cuda", "to", "cpu", "float", "half", "double", "bfloat16", "train", "eval", "requires_grad_",
                         "type", "share_memory", "apply", "to_empty", "xpu", "ipu"})


def without_parameters(m: SemanticModel, expr: ast.AST) -> bool:
    """``expr`` is a module with no parameters: every value it may hold is made by a
    ``torch.nn`` class that never has any (``nn.CrossEntropyLoss()``, ``nn.ReLU()``), possibly
    moved (``.cuda()``, ``.to(device)``). Nothing else counts: a class of the project, a
    container, a value that cannot be followed."""
    from dp2ddp.model.flow import origins
    from dp2ddp.model.names import DDP, DP

    seen = set()
    made = []  # the constructions found: at least one, or nothing is known

    def bare(e: ast.AST) -> bool:
        if id(e) in seen:
            return True  # ``crit = DP(crit)``: the wrap's own binding wraps what the others made
        seen.add(id(e))
        while isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in SAME_MODULE:
            e = e.func.value
        if isinstance(e, ast.Call):
            names = m.qualified_names(e.func)
            if names and names <= DP | DDP and e.args:
                return bare(e.args[0])
            made.append(e)
            return bool(names) and all(q.startswith("torch.nn.") and q.rsplit(".", 1)[1] in _NO_PARAMETERS for q in names)
        if isinstance(e, (ast.Name, ast.Attribute)):
            found = origins(m, e)
            return bool(found) and all(not path and bare(node) for node, path in found)
        return False

    return bare(expr) and bool(made)


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


_BUILTIN_VALUES = frozenset({"dict", "list", "set", "tuple", "int", "float", "str", "bool", "len", "range", "print"})
_CLASS_PARAMETERS = frozenset({"register_parameter", "register_buffer", "add_module", "register_module"})


def holds_only(m: SemanticModel, cls: ast.ClassDef, attr: str) -> bool:
    """``cls`` (an ``nn.Module``) holds no parameters but those of its ``self.<attr>``: every
    other ``self.X = value`` of the class (and of its family in this module) is a constant, a
    container of constants, a ``torch.nn`` module without parameters (a loss, an activation),
    an optimizer or scheduler, or a value of builtins; no ``nn.Parameter``, no
    ``register_parameter``/``add_module``. A wrapper (``self.encoder = DP(self.encoder)``,
    CMC's ``InsResNet50``) inside such a container is the whole of what trains in it."""
    from dp2ddp.model.stores import attribute_assignments

    for c in m.family(cls):
        for n in ast.walk(c):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _CLASS_PARAMETERS:
                return False

    def harmless(v: ast.AST) -> bool:
        if isinstance(v, (ast.Constant, ast.JoinedStr)):
            return True
        if isinstance(v, (ast.List, ast.Tuple, ast.Set)):
            return all(harmless(e) for e in v.elts)
        if isinstance(v, ast.Dict):
            return all(harmless(e) for e in v.values)
        if isinstance(v, ast.Call):
            names = m.qualified_names(v.func)
            if names and all(q.startswith("torch.optim") for q in names):  # an optimizer, a scheduler
                return True
            if isinstance(v.func, ast.Name) and v.func.id in _BUILTIN_VALUES and not names - {f"builtins.{v.func.id}", v.func.id}:
                return True
            return without_parameters(m, v)
        return False

    for name, values in attribute_assignments(m, cls).items():
        if name == attr:
            continue
        if not all(harmless(v) for v in values):
            return False
    return True


def wraps_all_it_holds(m: SemanticModel, target: Optional[ast.AST], node: ast.AST) -> bool:
    """A wrap assigned to ``self.X`` (``target``) at ``node``, in an ``nn.Module`` that holds
    nothing else that trains (:func:`holds_only`): the wrap is of the whole of what trains
    there, as in a plain class."""
    cls = m.enclosing_class(node)
    return (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
            and cls is not None and holds_only(m, cls, target.attr))


def wraps_a_part_of_its_module(m: SemanticModel, target: Optional[ast.AST], node: ast.AST) -> bool:
    """A wrap at ``node`` assigned to ``self.<...>`` inside an ``nn.Module`` that holds more
    that trains than the wrap (:func:`wraps_all_it_holds`): DDP must wrap the whole model
    where it is built (DDP101)."""
    from dp2ddp.model.syntax import root_name

    root = root_name(target) if target is not None else None
    return (root is not None and root.id == "self" and is_module_class(m, m.enclosing_class(node))
            and not wraps_all_it_holds(m, target, node))
