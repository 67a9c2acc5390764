from __future__ import annotations

import re
from typing import Iterable

import libcst as cst

from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding
import ast

from dp2ddp.rules.base import DDP_CODE, DDP_CONTEXT, GAP, Keep, Nodes, Rule, Text, Shape, is_ddp_code, positional, string_value, terminal_identifier

SET_DEVICE = frozenset({"torch.cuda.set_device", "torch.cuda.device"})
_LOCAL_RANK = re.compile(r"local_rank|LOCAL_RANK|localrank|local_process_index", re.IGNORECASE)


class BareCudaDevice(Rule):
    code = "DDP006"
    name = "cuda-device-without-local-rank"
    message = "bare `{what}` in DDP code without `torch.cuda.set_device(local_rank)`: every rank uses GPU 0"
    what = (
        "In DDP code that never calls `torch.cuda.set_device` and never reads the local rank, checks for "
        "`.cuda()` without a device and for the device strings `\"cuda\"` / `\"cuda:0\"`."
    )
    why = (
        "`.cuda()` and `\"cuda\"` mean the *current* device, which is GPU 0 unless the process selected "
        "another one. Every rank then puts its model and batches on GPU 0: the job runs out of memory on GPU 0 "
        "or NCCL fails with duplicate GPU errors, while the other GPUs stay idle."
    )
    fix_doc = (
        "Read `local_rank = int(os.environ[\"LOCAL_RANK\"])`, call `torch.cuda.set_device(local_rank)` "
        "before anything touches CUDA, and use `.to(local_rank)` / `f\"cuda:{local_rank}\"`."
    )
    needs = (
        DDP_CODE,
        # `.cuda(`, or a literal "cuda" / "cuda:0" (or one that escapes could spell so)
        Shape(
            lambda ix: _shape(ix),
            "cuda",
            "\\",
            pattern=rb"\." + GAP + rb"cuda" + GAP + rb"(?:\)" + GAP + rb")*\(|(?:[\"']cuda(?::0)?[\"'])|[\"'][^\"'\r\n]{0,12}\\(?:[xuUN0-7]|\r?\n|\r)",
        ),
    )
    # findings (`.cuda`, "cuda" strings) and what silences the rule anywhere in the module:
    # a set_device call, a name or string spelled like the local rank
    keep = (
        Nodes((ast.Call,), lambda n, _n: _bare_cuda_call(n) or _cuda_literal_in(n.func, *n.args, *n.keywords)),
        Nodes((ast.Assign, ast.AnnAssign), lambda n, _n: _cuda_literal_in(n.value)),
        Nodes((ast.IfExp,), lambda n, _n: _cuda_literal_in(n.test, n.body, n.orelse)),
        Nodes((ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda), lambda n, _n: _cuda_literal_in(*n.args.defaults, *n.args.kw_defaults)),
        Nodes((ast.ClassDef,), lambda n, _n: _cuda_literal_in(*n.bases, *n.keywords)),
        Keep(Text(refs=SET_DEVICE)),
        # what _mentions_local_rank reads: every Name (parameters and keyword names too),
        # by its text, and every string, by its value (escapes can spell it)
        Keep(Text(words=_LOCAL_RANK.pattern)),
        Nodes((ast.Constant,), lambda n, _n: isinstance(n.value, str) and bool(_LOCAL_RANK.search(n.value))),
        DDP_CONTEXT,
    )
    invalid = (
        "import torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\nmodel = model.cuda()\n",
        "import torch\nimport torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\ndevice = torch.device(\"cuda:0\")\n",
    )
    valid = (
        "import os\n\nimport torch\nimport torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\n"
        "torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))\nmodel = model.cuda()\n",
        "import os\n\nimport torch\nimport torch.distributed as dist\n\nlocal_rank = int(os.environ[\"LOCAL_RANK\"])\n"
        "dist.init_process_group(\"nccl\")\nmodel = model.to(f\"cuda:{local_rank}\")\n",
        "import torch\n\nmodel = model.cuda()  # not DDP code\n",
        "import torch.distributed as dist\n\nif tensor.device.type == \"cuda\":\n    pass\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        if not is_ddp_code(an):
            return []
        if an.calls(SET_DEVICE) or _mentions_local_rank(an):
            return []
        out = []
        for call in an.nodes_of(cst.Call):
            f = call.func
            if isinstance(f, cst.Attribute) and f.attr.value == "cuda" and not positional(call) and not any(
                a.keyword is not None and a.keyword.value == "device" for a in call.args
            ):
                if an.is_name(f, {"torch.cuda"}):
                    continue  # the module torch.cuda is not called
                out.append(self.finding(f.attr, self.message.format(what=".cuda()")))
        for s in an.nodes_of(cst.SimpleString):
            v = string_value(s)
            if v not in ("cuda", "cuda:0"):
                continue
            parent = an.parent(s)
            if isinstance(parent, (cst.Arg, cst.Assign, cst.AnnAssign, cst.IfExp, cst.Param)) or (
                isinstance(parent, cst.Call)
            ):
                out.append(self.finding(s, self.message.format(what=f'"{v}"')))
        return out


def _shape(ix) -> bool:
    """Pre-filter: a ``.cuda()`` call without a device, or a string with ``cuda`` in it, and
    no name, attribute or plain string spelled like the local rank and no certain
    ``set_device`` call (then the rule never reports)."""
    return _may_report(ix) and not _plain_string_mentions_local_rank(ix) and not ix.facts.definite(SET_DEVICE, called=True)


def _may_report(ix) -> bool:
    # (on ASCII lines only: ast normalizes ``ｌocal_rank`` to ``local_rank``, LibCST does not)
    for n in ix.of(ast.Name):
        if _LOCAL_RANK.search(n.id) and ix.facts.ascii(n):
            return False
    for n in ix.of(ast.Attribute):
        if _LOCAL_RANK.search(n.attr) and ix.facts.ascii(n):
            return False
    # a bare .cuda() call, or a "cuda" / "cuda:0" literal where the rule looks (an argument,
    # an assigned value, a conditional expression, a parameter default); the rule never
    # reports a part of an implicitly concatenated string, which ast joins into one constant
    if any(_bare_cuda_call(c) or _cuda_literal_in(c.func, *c.args, *c.keywords) for c in ix.of(ast.Call)):
        return True
    if any(_cuda_literal_in(n.value) for n in ix.of(ast.Assign, ast.AnnAssign)):
        return True
    if any(_cuda_literal_in(n.test, n.body, n.orelse) for n in ix.of(ast.IfExp)):
        return True
    if any(_cuda_literal_in(*n.bases, *n.keywords) for n in ix.of(ast.ClassDef)):  # LibCST: Arg nodes
        return True
    return any(_cuda_literal_in(*n.defaults, *n.kw_defaults) for n in ix.of(ast.arguments))


_QUOTED = re.compile(rb"[rRuU]?(\'\'\'|\"\"\"|'|\")")


def _plain_string_mentions_local_rank(ix) -> bool:
    """A string literal that LibCST also sees as one ``SimpleString`` with that text: a
    single token without escapes, one-line unless triple-quoted (``ast`` joins ``"a" "b"``
    into one constant, and f-string text is no ``SimpleString``)."""
    source = ix.facts.source
    if source.startswith(b"\xef\xbb\xbf") or b"coding" in b"\n".join(source.split(b"\n", 2)[:2]):
        return False  # ast's columns are not offsets into these bytes
    parts = {id(v) for j in ix.of(ast.JoinedStr) for v in j.values}
    for n in ix.of(ast.Constant):
        if not isinstance(n.value, str) or id(n) in parts or not _LOCAL_RANK.search(n.value):
            continue
        lines = ix.facts.lines
        if n.end_lineno > len(lines):
            continue
        if n.lineno == n.end_lineno:
            token = lines[n.lineno - 1][n.col_offset : n.end_col_offset]
        else:
            token = b"\n".join(
                [lines[n.lineno - 1][n.col_offset :], *lines[n.lineno : n.end_lineno - 1], lines[n.end_lineno - 1][: n.end_col_offset]]
            )
        m = _QUOTED.match(token)
        if m is None:
            continue
        q = m.group(1)
        if len(q) == 1 and n.lineno != n.end_lineno:
            continue
        inner = token[m.end() : len(token) - len(q)]
        if (
            len(token) >= m.end() + len(q)
            and token.endswith(q)
            and q not in inner
            and b"\\" not in inner
            and _LOCAL_RANK.search(inner.decode("utf-8", "replace"))
        ):
            return True
    return False


def _bare_cuda_call(call) -> bool:
    f = call.func
    return (
        isinstance(f, ast.Attribute)
        and f.attr == "cuda"
        and not any(not isinstance(a, ast.Starred) for a in call.args)
        and not any(k.arg == "device" for k in call.keywords)
    )


def _cuda_literal_in(*nodes) -> bool:
    """One of ``nodes`` (an argument, keyword, value, default) is a "cuda" literal."""
    for n in nodes:
        if isinstance(n, (ast.Starred, ast.keyword)):
            n = n.value
        if _is_cuda_literal(n):
            return True
    return False


def _is_cuda_literal(node) -> bool:
    return isinstance(node, ast.Constant) and node.value in ("cuda", "cuda:0")


def _mentions_local_rank(an: Analysis) -> bool:
    key = "rules:local-rank"
    if key not in an.cache:
        found = False
        for n in an.nodes_of(cst.Name, cst.Attribute, cst.SimpleString):
            ident = terminal_identifier(n) if not isinstance(n, cst.SimpleString) else string_value(n)
            if ident and _LOCAL_RANK.search(ident):
                found = True
                break
        an.cache[key] = found
    return an.cache[key]
