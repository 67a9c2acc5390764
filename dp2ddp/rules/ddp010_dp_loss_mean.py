from __future__ import annotations

import re
from typing import Iterable

import libcst as cst

from dp2ddp.analysis import Analysis
from dp2ddp.engine import Finding, Fix, Remove
import ast

from dp2ddp.rules.base import DDP_CODE, DDP_CONTEXT, GAP, Keep, Rule, Text, Shape, Tokens, ast_words, is_ddp_code, terminal_identifier

_GPU_COUNT = re.compile(r"n_?gpus?$|num_?gpus?$|gpu_?count$|device_count$|world_size$", re.IGNORECASE)


class DPLossMean(Rule):
    code = "DDP010"
    name = "data-parallel-loss-mean"
    message = "leftover DataParallel idiom: `if n_gpu > 1: loss = loss.mean()` does nothing under DDP"
    what = (
        "In DDP code, checks for an `if` on the GPU count (`n_gpu`, `args.n_gpu`, `torch.cuda.device_count()`) "
        "whose body only averages a value over itself (`loss = loss.mean()`)."
    )
    why = (
        "DataParallel gathers one loss per GPU, so scripts average them when `n_gpu > 1`. Under DDP each process "
        "computes one scalar loss for its own batch and the gradient averaging happens in the backward pass; "
        "the idiom is dead code that suggests the script still thinks it is DataParallel, and it hides the "
        "real question of how the loss should be reduced across ranks."
    )
    fix_doc = "Delete the `if` (the fix does this when the block holds nothing else)."
    fixable = True
    needs = (
        DDP_CODE,
        Tokens("gpu", "device_count", "world_size", ignore_case=True),  # _GPU_COUNT ignores case
        Shape(lambda ix: _shape(ix), "mean", pattern=rb"\." + GAP + rb"mean" + GAP + rb"\(" + GAP + rb"\)"),
    )
    keep = (Keep(Text(words=r"\bmean\b")), DDP_CONTEXT)
    invalid = (
        "import torch.distributed as dist\n\nloss = criterion(model(x), y)\nif args.n_gpu > 1:\n"
        "    loss = loss.mean()  # mean() to average on multi-gpu.\nloss.backward()\n",
    )
    valid = (
        "import torch.distributed as dist\n\nloss = criterion(model(x), y)\nloss.backward()\n",
        "loss = criterion(model(x), y)\nif n_gpu > 1:\n    loss = loss.mean()  # not DDP code\n",
    )

    def check(self, an: Analysis) -> Iterable[Finding]:
        if not is_ddp_code(an):
            return []
        out = []
        for node in an.nodes_of(cst.If):
            if not _tests_gpu_count(node.test):
                continue
            stmts = list(node.body.body)
            simple = [s for s in stmts if isinstance(s, cst.SimpleStatementLine)]
            if not simple or len(simple) != len(stmts):
                continue
            smalls = [x for s in simple for x in s.body]
            if not all(_self_mean(x) for x in smalls):
                continue
            fix = None
            parent = an.parent(node)
            if node.orelse is None and not (isinstance(parent, cst.If) and parent.orelse is node):
                fix = Fix([Remove(node)], description="remove the DataParallel loss averaging")
            out.append(self.finding(node, fix=fix))
        return out


def _shape(ix) -> bool:
    """Pre-filter: an ``if`` on something named like a GPU count whose body is only
    assignments of ``<x>.mean()``."""
    for node in ix.of(ast.If):
        body = node.body
        if not body or not all(
            isinstance(s, ast.Assign)
            and len(s.targets) == 1
            and isinstance(s.value, ast.Call)
            and isinstance(s.value.func, ast.Attribute)
            and s.value.func.attr == "mean"
            and not s.value.args
            and not s.value.keywords
            for s in body
        ):
            continue
        if any(_GPU_COUNT.search(w) for w in ast_words(node.test)):
            return True
    return False


def _tests_gpu_count(test: cst.BaseExpression) -> bool:
    found = False

    class _V(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            nonlocal found
            if isinstance(node, (cst.Name, cst.Attribute, cst.Call)):
                ident = terminal_identifier(node)
                if ident and _GPU_COUNT.search(ident):
                    found = True
            return not found

    test.visit(_V())
    return found


def _self_mean(small: cst.CSTNode) -> bool:
    if not isinstance(small, cst.Assign) or len(small.targets) != 1:
        return False
    target, value = small.targets[0].target, small.value
    if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Attribute):
        return False
    if value.func.attr.value != "mean" or value.args:
        return False
    return target.deep_equals(value.func.value)
