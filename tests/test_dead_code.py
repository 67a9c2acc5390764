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
