"""The dead-code fact (:mod:`dp2ddp.model.dead_code`): what lies under a test that is false on
every run makes no effect, and anything that may be true is not dead."""

from __future__ import annotations

import ast

import pytest

from dp2ddp.model.core import build
from dp2ddp.model.dead_code import never_runs


def _marked(src: str):
    m = build(src.encode(), "t.py")
    calls = [c for c in m.nodes(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == "mark"]
    assert calls, src
    return m, calls[0]


@pytest.mark.parametrize("src", [
    "def f():\n    if False:\n        mark()\n",
    "def f():\n    if 0:\n        mark()\n",
    "def f():\n    debug = False\n    if debug:\n        mark()\n",
    "def f(n):\n    subset, boxes, loaded = False, False, False\n    if subset and n < 10:\n        if n == 0:\n            mark()\n",
    "def f():\n    on = True\n    if not on:\n        mark()\n",
    "def f():\n    if True:\n        pass\n    else:\n        mark()\n",
    "def f():\n    a = False\n    if a:\n        pass\n    a = 0\n    if a:\n        mark()\n",
], ids=["false", "zero", "local_false", "tuple_unpacked_false_under_and", "not_true", "else_of_true", "every_binding_false"])
def test_code_under_a_test_false_on_every_run_never_runs(src: str) -> None:
    m, call = _marked(src)
    assert never_runs(m, call)


@pytest.mark.parametrize("src", [
    "def f(debug=False):\n    if debug:\n        mark()\n",
    "DEBUG = False\n\ndef f():\n    if DEBUG:\n        mark()\n",
    "def f():\n    debug = False\n    debug = True\n    if debug:\n        mark()\n",
    "def f(x):\n    debug = False\n    if debug or x:\n        mark()\n",
    "def f():\n    debug = False\n    for debug in (True,):\n        pass\n    if debug:\n        mark()\n",
    "def f():\n    if False:\n        pass\n    mark()\n",
    "def f():\n    a, b = False, g()\n    if b:\n        mark()\n",
], ids=["parameter", "module_global", "rebound_true", "or_with_unknown", "rebound_by_a_loop", "after_the_if", "unpacked_call"])
def test_code_that_may_run_is_not_dead(src: str) -> None:
    m, call = _marked(src)
    assert not never_runs(m, call)


@pytest.mark.parametrize("src, found", [
    ("loss.backward(create_graph=True)\n", 1),
    ("loss.backward(create_graph=flag)\n", 1),
    ("g = torch.autograd.grad(loss, model.parameters(), create_graph=True)\n", 1),
    ("g = torch.autograd.grad(loss, list(model.parameters()), None, True, True)\n", 1),
    ("loss.backward(None, True, True)\n", 1),
    ("torch.autograd.backward(loss, None, True, True)\n", 1),
    ("torch.autograd.backward(loss, None, True)\n", 0),
    ("loss.backward(create_graph=False)\n", 0),
    ("loss.backward()\n", 0),
    ("g = torch.autograd.grad(loss, params)\n", 0),
    ("def f(loss):\n    hessian = False\n    loss.backward(create_graph=hessian)\n", 0),
], ids=["true", "a_flag", "autograd_grad", "autograd_grad_positional", "backward_positional",
        "autograd_backward_positional", "autograd_backward_retain_graph_only", "false", "plain",
        "first_order_grad", "local_false"])
def test_second_order_backward_passes_are_those_whose_create_graph_may_be_true(src: str, found: int) -> None:
    """The fact DDP174 refuses on (:func:`dp2ddp.model.steps.second_order`): a flag that may be
    true counts, a false one (constant, or a local set only to False) does not."""
    from dp2ddp.model.steps import second_order

    m = build(("import torch\n" + src).encode(), "t.py")
    assert len(second_order(m)) == found


@pytest.mark.parametrize("src, found", [
    ("g = torch.autograd.grad(loss, model.parameters(), create_graph=True)\n", 1),
    ("params = [p for p in model.parameters()]\ng = torch.autograd.grad(loss, params, create_graph=True)\n", 1),
    ("g = torch.autograd.grad(outputs=d, inputs=interpolates, create_graph=True, only_inputs=True)\n", 0),
    ("g = torch.autograd.grad(loss, delta, create_graph=True)[0]\n", 0),
], ids=["parameters", "a_list_of_parameters", "wgan_gp_penalty", "adversarial_delta"])
def test_a_graph_of_gradients_counts_for_parameters_not_for_inputs(src: str, found: int) -> None:
    """A gradient with respect to an input (a gradient penalty, an adversarial perturbation)
    never meets DDP's hooks, which fire for parameters: those migrate (SAGAN's did, verified)."""
    from dp2ddp.model.steps import second_order

    m = build(("import torch\n" + src).encode(), "t.py")
    assert len(second_order(m)) == found
