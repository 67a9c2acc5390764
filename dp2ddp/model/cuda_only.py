"""Code that only runs with CUDA, and code that assumes CUDA outside such a test.

A migrated script runs on CPU too (gloo), so what a script's own distributed path assumes
about CUDA must be asked where it stands:

* :func:`cuda_test`: a test that holds only with CUDA (``torch.cuda.is_available()``,
  ``args.cuda``, ``device == "cuda"``); :func:`under_cuda_test`: a node that only runs
  after such a test; :func:`ran_on_every_gpu_machine`: a wrap's tests all hold with CUDA;
* outside such a test: :func:`cuda_calls` (``x.cuda()``), :func:`cuda_asserts` (``assert
  torch.cuda.device_count() > rank``), :func:`rank_devices` (``torch.device("cuda", r)``,
  ``"cuda:%d" % r``), :func:`cuda_device_arguments` (a wrap's ``device_ids=[r]``);
* :func:`device_test`: a looser reading, a test whose words are about the devices
  (``torch.cuda.device_count() > 1``, ``args.n_gpu > 1``): on one device or CPU it may fail.
"""

from __future__ import annotations

import ast
import re
from typing import List, Tuple

from dp2ddp.model.core import SemanticModel
from dp2ddp.model.names import CUDA_AVAILABLE
from dp2ddp.model.syntax import FUNCTIONS, kwarg

CUDA_FLAGS = frozenset({"cuda", "use_cuda", "is_cuda", "has_cuda", "use_gpu", "on_gpu", "gpu"})
_DEVICE_WORDS = re.compile(r"gpu|cuda|device|world_size|parallel|distributed", re.IGNORECASE)


def device_test(m: SemanticModel, test: ast.AST) -> bool:
    """The test depends on the devices by its words (``if torch.cuda.device_count() > 1``,
    ``if device == "cuda"``, ``if args.n_gpu > 1``): a wrap under it did not exist on one
    device or CPU."""
    return bool(_DEVICE_WORDS.search(m.source(test)))


def count_test(m: SemanticModel, test: ast.AST) -> bool:
    """A :func:`device_test` that counts the devices (``torch.cuda.device_count() > 1``,
    ``args.n_gpu > 1``, ``len(gpu_ids) > 1``), not a flag the user sets (``if args.parallel:``,
    ``if self.multi_gpu:``): under a flag, the DataParallel run that is migrated is the one
    with the flag on, whatever the devices."""
    if isinstance(test, ast.BoolOp):
        # ``if args.device.gpu and not args.serialized:`` (lsq-net: a list of GPU ids, one id on
        # one GPU) counts nothing; ``if use_cuda and n_gpu > 1:`` does, through its operand
        parts = [count_test(m, v) for v in test.values]
        return any(parts) if isinstance(test.op, ast.And) else all(parts)
    inner = test.operand if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) else test
    if isinstance(inner, ast.Compare) and len(inner.ops) == 1 and isinstance(inner.ops[0], (ast.Is, ast.IsNot)):
        if any(isinstance(c, ast.Constant) and c.value is None for c in [inner.left, *inner.comparators]):
            # ``if args.gpu is not None: (one GPU) else: DataParallel``: whether the user named a
            # device, an option of theirs, not a count (kaidic/LDAM-DRW's shape)
            return False
    if isinstance(inner, ast.Compare) and len(inner.ops) == 1 and isinstance(inner.ops[0], (ast.Eq, ast.Is)):
        if any(isinstance(c, ast.Constant) and isinstance(c.value, bool) for c in inner.comparators):
            inner = inner.left  # ``args.parallel == True``
    if isinstance(inner, ast.Name) and _names_a_count(m, inner):
        return True  # ``multi_gpus = torch.cuda.device_count() > 1`` ... ``if multi_gpus:``
    return device_test(m, test) and not isinstance(inner, (ast.Name, ast.Attribute))


def _names_a_count(m: SemanticModel, name: ast.Name) -> bool:
    """Every value the name may hold is a comparison that counts devices (no user's option)."""
    from dp2ddp.model.flow import origins

    found = origins(m, name)
    return bool(found) and all(not path and isinstance(node, ast.Compare) and count_test(m, node) for node, path in found)


def cuda_test(m: SemanticModel, test: ast.AST) -> bool:
    """The test holds only with CUDA: ``torch.cuda.is_available()``, ``args.cuda``,
    ``use_cuda``, ``x.is_cuda``, ``device == "cuda"`` (also as one operand of ``and``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(cuda_test(m, v) for v in test.values)
    if isinstance(test, ast.Call):
        return m.is_name(test.func, CUDA_AVAILABLE)
    if isinstance(test, (ast.Name, ast.Attribute)):
        return (test.id if isinstance(test, ast.Name) else test.attr) in CUDA_FLAGS
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.Is)):
        sides = [test.left] + test.comparators
        return any(isinstance(x, ast.Constant) and x.value == "cuda" for x in sides)  # also `x.type == "cuda"`
    return False


def ran_on_every_gpu_machine(m: SemanticModel, tests) -> bool:
    """A wrap under these tests (its ``if`` conditions, innermost first) ran wherever CUDA is
    available: every test holds with CUDA, an ``and`` only when each of its operands does
    (``if use_cuda and n_gpu > 1:`` skipped a one-GPU machine, unlike :func:`cuda_test`,
    which asks whether a node *only* runs with CUDA). A wrap with no test is not guarded."""

    def holds(test: ast.AST) -> bool:
        if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
            return all(holds(v) for v in test.values)
        return cuda_test(m, test)

    tests = list(tests)
    return bool(tests) and all(holds(t) for t in tests)


def one_gpu_ran_bare(m: SemanticModel, tests) -> bool:
    """A wrap under these tests (its ``if`` conditions) did not run on a machine with one GPU
    or none: one of them counts the devices (:func:`count_test`) and they do not all hold
    wherever CUDA is (:func:`ran_on_every_gpu_machine`). Such a run saved its model's keys
    without ``module.``; any other wrap (unconditional, on both branches of ``if cuda:``,
    under a flag of the user's) gave every run a wrapper."""
    tests = list(tests)
    return any(count_test(m, t) for t in tests) and not ran_on_every_gpu_machine(m, tests)


def under_cuda_test(m: SemanticModel, node: ast.AST) -> bool:
    """``node`` only runs with CUDA: in the body of an ``if``/conditional expression whose test
    holds only with CUDA (or the ``else`` of ``if not <that>:``), or after such a test in an
    ``and``; in its function."""
    child = node
    for a in m.ancestors(node):
        if isinstance(a, ast.If) and child is not a.test and any(child is s for s in a.body) and cuda_test(m, a.test):
            return True
        if (
            isinstance(a, ast.If)
            and any(child is s for s in a.orelse)
            and isinstance(a.test, ast.UnaryOp)
            and isinstance(a.test.op, ast.Not)
            and cuda_test(m, a.test.operand)
        ):
            return True  # if not torch.cuda.is_available(): ... elif/else: (CUDA from here)
        if isinstance(a, ast.IfExp) and child is a.body and cuda_test(m, a.test):
            return True
        if isinstance(a, ast.BoolOp) and isinstance(a.op, ast.And) and child in a.values:
            if any(cuda_test(m, v) for v in a.values[: a.values.index(child)]):
                return True
        if isinstance(a, FUNCTIONS + (ast.ClassDef,)):
            return False
        child = a
    return False


def cuda_calls(m: SemanticModel) -> List[ast.Call]:
    """``x.cuda()`` outside a CUDA test, on a receiver that is a name, attribute or
    subscript without calls (``model``, ``self.net``, ``batch[0]``), in source order."""
    out = []
    for call in m.nodes(ast.Call):
        f = call.func
        if not (isinstance(f, ast.Attribute) and f.attr == "cuda"):
            continue
        if not isinstance(f.value, (ast.Name, ast.Attribute, ast.Subscript)) or any(isinstance(n, ast.Call) for n in ast.walk(f.value)):
            continue
        if not under_cuda_test(m, call):
            out.append(call)
    return out


def cuda_asserts(m: SemanticModel) -> List[ast.Assert]:
    """``assert torch.cuda.device_count() > rank`` (or ``is_available()``) outside a CUDA test."""
    names = {"torch.cuda.device_count", "torch.cuda.is_available"}
    return [node for node in m.nodes(ast.Assert)
            if any(isinstance(n, (ast.Name, ast.Attribute)) and m.is_name(n, names) for n in ast.walk(node.test))  # type: ignore[attr-defined]
            and not under_cuda_test(m, node)]


def device_string(node: ast.AST) -> bool:
    """``'cuda:%d' % rank``, ``'cuda:{}'.format(rank)``, ``f"cuda:{rank}"``: a device string
    built from a rank."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return isinstance(node.left, ast.Constant) and isinstance(node.left.value, str) and node.left.value.startswith("cuda:")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        v = node.func.value
        return isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith("cuda:")
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        return isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value.startswith("cuda:")
    return False


def rank_devices(m: SemanticModel) -> List[Tuple[ast.AST, str]]:
    """A rank's CUDA device outside a CUDA test, in source order: ``(node, "device")`` for
    ``torch.device("cuda", r)``, ``(node, "string")`` for a :func:`device_string` that is not
    the one argument of ``torch.device(...)`` (neither that call nor its string counts)."""
    out: List[Tuple[ast.AST, str]] = []
    for node in m.nodes(ast.Call, ast.BinOp, ast.JoinedStr):
        if under_cuda_test(m, node):
            continue
        if isinstance(node, ast.Call) and m.is_name(node.func, {"torch.device"}):
            first = node.args[0] if node.args else None
            if len(node.args) == 2 and isinstance(first, ast.Constant) and first.value == "cuda":
                out.append((node, "device"))
        elif device_string(node):
            parent = m.parent(node)
            if not (isinstance(parent, ast.Call) and m.is_name(parent.func, {"torch.device"})):
                out.append((node, "string"))
    return out


def cuda_device_arguments(m: SemanticModel, call: ast.Call) -> List[ast.AST]:
    """The ``device_ids=`` and ``output_device=`` values of a wrap that name a CUDA device
    on every machine (not ``None``, not already ``... if torch.cuda.is_available() ...``)."""
    out = []
    for name in ("device_ids", "output_device"):
        k = kwarg(call, name)
        if k is None or (isinstance(k.value, ast.Constant) and k.value.value is None):
            continue
        if not any(m.is_name(n, CUDA_AVAILABLE) for n in ast.walk(k.value) if isinstance(n, (ast.Name, ast.Attribute))):
            out.append(k.value)
    return out
