"""The bare module a forward on some ranks calls is fed as the wrapper fed it.

An H200 run found it: rank 0's evaluation, handed ``net.module`` (a DDP forward on one rank
waits for the others), ran a CPU tensor through a model on the GPU and raised, where the
original's DataParallel had moved that tensor onto the GPU. The migration hands
``fed_like_the_wrapper(net.module)``; here a model on the ``meta`` device stands in for one on
the GPU (a CPU tensor fed to either raises), so the CPU shows what the GPU showed.
"""
from __future__ import annotations

import collections

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from dp2ddp.templates import load  # noqa: E402


def _helper():
    space: dict = {"torch": torch}
    exec(load("fed_like_the_wrapper.py.tmpl").format(helper="fed_like_the_wrapper", torch="torch"), space)
    return space["fed_like_the_wrapper"]


Pair = collections.namedtuple("Pair", "a b")


class Echo(nn.Module):
    """Returns what it was handed (and where), beside one parameter that says where it lives."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x, pair, items, extra=None):
        return x, pair, items, extra


def test_a_cpu_tensor_through_a_bare_module_elsewhere_raises_without_it() -> None:
    # what the GPU showed, on the CPU: the bare module is not fed as DataParallel fed it
    with pytest.raises(RuntimeError):
        nn.Linear(4, 2).to("meta")(torch.randn(3, 4)).sum().item()


def test_inputs_move_onto_the_models_device_at_every_depth() -> None:
    fed = _helper()
    module = fed(Echo().to("meta"))
    x, pair, items, extra = module(torch.randn(2), Pair(torch.randn(1), 3), [torch.randn(1), {"k": torch.randn(1)}],
                                   extra=(torch.randn(1),))
    assert x.device.type == "meta"
    assert isinstance(pair, Pair) and pair.a.device.type == "meta" and pair.b == 3
    assert isinstance(items, list) and items[0].device.type == "meta" and items[1]["k"].device.type == "meta"
    assert extra[0].device.type == "meta"
    assert fed(nn.Linear(4, 2).to("meta"))(torch.randn(3, 4)).device.type == "meta"  # the raise above, gone


def test_on_the_cpu_nothing_moves_and_the_hook_is_added_once() -> None:
    fed = _helper()
    echo = Echo()
    assert fed(fed(echo)) is echo
    assert len(echo._forward_pre_hooks) == 1
    x = torch.randn(2)
    assert echo(x, Pair(x, 1), [x])[0] is x  # the same tensor: no copy on the CPU, as DataParallel made none
