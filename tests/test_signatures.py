"""dp2ddp.model.signatures.bind: a call's arguments to a def's parameters, checked against
what Python itself binds when the call runs."""

from __future__ import annotations

import inspect
from typing import Dict, List, Tuple

import libcst as cst
import pytest

from dp2ddp.model.signatures import BindError, bind

# every argument is a name that evaluates to its own spelling, so the values Python binds
# say which expression went where
NAMES = {n: n for n in ("a1", "a2", "a3", "a4", "k1", "k2")}


def _parse(def_src: str, call_src: str):
    func = cst.parse_module(def_src + "\n").body[0]
    call = cst.parse_expression(call_src)
    assert isinstance(func, cst.FunctionDef) and isinstance(call, cst.Call)
    return call, func


def _python_binds(def_src: str, call_src: str) -> Tuple[Dict[str, object], List[str]]:
    """What running the call binds (the function returns its locals), and the order of
    the function's parameters."""
    ns: Dict[str, object] = dict(NAMES)
    exec(def_src.rstrip().rstrip(".").rstrip() + " return dict(locals())\n", ns)  # noqa: S102
    return eval(call_src, ns), list(inspect.signature(ns["f"]).parameters)  # noqa: S307


def _ours(def_src: str, call_src: str, **kw) -> Dict[str, object]:
    call, func = _parse(def_src, call_src)
    module = cst.Module([])
    return {k: eval(module.code_for_node(v), dict(NAMES)) for k, v in bind(call, func, **kw).items()}  # noqa: S307


CASES = [
    ("def f(x, y): ...", "f(a1, a2)"),
    ("def f(x, y): ...", "f(a1, y=a2)"),
    ("def f(x, y): ...", "f(y=a2, x=a1)"),
    ("def f(x, y='d'): ...", "f(a1)"),
    ("def f(x, y='d', *, z='e'): ...", "f(a1, z=k1)"),
    ("def f(x, *args): ...", "f(a1, a2, a3)"),
    ("def f(x, *args): ...", "f(a1)"),
    ("def f(x, **kw): ...", "f(a1, k=k1, j=k2)"),
    ("def f(x, **kw): ...", "f(x=a1)"),
    ("def f(x, /, y, **kw): ...", "f(a1, a2, x=k1)"),
    ("def f(x, /, y): ...", "f(a1, y=a2)"),
    ("def f(*args, **kw): ...", "f(a1, a2, k=k1)"),
    ("def f(x, *args, y, z='d', **kw): ...", "f(a1, a2, a3, y=k1, w=k2)"),
    ("def f(x, *, y): ...", "f(a1, y=a2)"),
    ("def f(): ...", "f()"),
    # Python raises TypeError on each of these; bind raises BindError
    ("def f(x): ...", "f(a1, a2)"),
    ("def f(x, y): ...", "f(a1)"),
    ("def f(x): ...", "f(a1, x=a2)"),
    ("def f(x): ...", "f(y=a1)"),
    ("def f(x, /): ...", "f(x=a1)"),
    ("def f(x, *, y): ...", "f(a1, a2)"),
    ("def f(x, *, y): ...", "f(a1)"),
]


@pytest.mark.parametrize("def_src, call_src", CASES)
def test_bind_agrees_with_python(def_src, call_src):
    try:
        expected, order = _python_binds(def_src, call_src)
    except TypeError:
        with pytest.raises(BindError):
            _ours(def_src, call_src)
        return
    got = _ours(def_src, call_src)
    assert got == expected
    assert list(got) == order  # in the order of the parameters


def test_bind_gives_the_call_expressions_themselves():
    call, func = _parse("def f(x, y=1 + 2, *rest, **kw): ...", "f(a.b(), 3, 4, k=5)")
    got = bind(call, func)
    assert got["x"] is call.args[0].value
    assert got["y"] is call.args[1].value
    assert isinstance(got["rest"], cst.Tuple) and [e.value for e in got["rest"].elements] == [call.args[2].value]
    assert isinstance(got["kw"], cst.Dict) and got["kw"].elements[0].value is call.args[3].value
    call, func = _parse("def f(x, y=1 + 2): ...", "f(0)")
    assert bind(call, func)["y"] is func.params.params[1].default


def test_bind_a_method_call_leaves_self_out():
    call, func = _parse("def step(self, batch, lr=0.1): ...", "trainer.step(a1)")
    assert {k: cst.Module([]).code_for_node(v) for k, v in bind(call, func, method=True).items()} == {"batch": "a1", "lr": "0.1"}
    with pytest.raises(BindError):
        bind(*_parse("def f(): ...", "obj.f()"), method=True)


@pytest.mark.parametrize("call_src", ["f(*xs)", "f(a1, **kw)"])
def test_unpacked_arguments_do_not_bind_statically(call_src):
    with pytest.raises(BindError):
        bind(*_parse("def f(*args, **kwargs): ...", call_src))
