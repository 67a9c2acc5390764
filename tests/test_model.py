"""The facts of dp2ddp/model that the lint rules added or fixed (unit tests)."""

from __future__ import annotations

import ast
import textwrap

from dp2ddp.model.collectives import call_reaches, is_ddp_code
from dp2ddp.model.core import build
from dp2ddp.model.ranks import mentions_local_rank, rank_split_conditionals, splits_ranks
from dp2ddp.model.dp_idioms import dp_loss_means, is_elif
from dp2ddp.model.wraps import dp_type_refs


def _m(src: str):
    return build(textwrap.dedent(src))


def _calls(m, name: str):
    return [c for c in m.nodes(ast.Call) if m.source(c.func) == name]


# --------------------------------------------------------------------------- core


def test_lines_are_pythons_lines():
    """Form feeds, vertical tabs and U+2028 are no line breaks for Python (``str.splitlines``
    thought they were, which moved every later line: positions, ``# noqa``)."""
    src = "a = 1  # page\x0cbreak \u2028 sep \x0b vt \x1c fs\nb = 2\r\nc = 3\rd = 4\n"
    m = build(src)
    assert [m.line_text(i) for i in (1, 2, 3, 4)] == [
        "a = 1  # page\x0cbreak \u2028 sep \x0b vt \x1c fs",
        "b = 2",
        "c = 3",
        "d = 4",
    ]
    d = m.nodes(ast.Assign)[-1]
    assert m.position(d) == (4, 0) and m.line_text(4).startswith("d")


def test_import_names_and_mentions():
    m = _m(
        """
        import torch.distributed as dist
        from torch.utils import data
        from . import local
        from torch.nn import *

        def cleanup():
            dist.destroy_process_group()

        x = data.DataLoader
        """
    )
    assert m.import_names == {"torch.distributed", "torch.utils", "torch.utils.data", "torch.nn"}
    assert m.mentions({"torch.distributed.destroy_process_group"})
    assert m.mentions({"torch.utils.data.DataLoader"})
    assert not m.mentions({"torch.save"})
    # a store counts (LibCST's all_qnames did too), a shadowed name does not
    assert _m("import torch\ntorch.save = None\n").mentions({"torch.save"})
    assert not _m("import torch\ndef f(torch):\n    torch.save(1)\n").mentions({"torch.save"})
    assert _m("from torch import save as s\n").mentions({"torch.save"})


# --------------------------------------------------------------------------- collectives


def test_a_call_reaches_an_inherited_or_base_method():
    """``super().__init__()``, ``super(C, self).setup()``, ``Base.__init__(self)`` reach the
    base class's method, and ``Child()`` with no ``__init__`` of its own reaches the one it
    inherits: a folder the base makes is seen from the subclass's construction."""
    m = _m("""
        class Base:
            def __init__(self):
                self.setup()

            def setup(self):
                pass


        class Child(Base):
            def __init__(self):
                super().__init__()
                super(Child, self).setup()
                Base.__init__(self)


        class Bare(Base):
            pass


        Bare()
        Child()
        Child().setup()
        Either = Base if Bare else Child
        Either().setup()
    """)
    base_init, setup = m.classes["Base"].body
    assert [m.resolve_call(c) for c in _calls(m, "super().__init__")] == [base_init]
    assert [m.resolve_call(c) for c in _calls(m, "super(Child, self).setup")] == [setup]
    assert [m.resolve_call(c) for c in _calls(m, "Base.__init__")] == [base_init]
    assert [m.resolve_call(c) for c in _calls(m, "Bare")] == [base_init]
    assert [m.resolve_call(c) for c in _calls(m, "Child")] == [m.classes["Child"].body[0]] * 2
    assert setup in m.reach(m.classes["Child"].body[0])
    # a method of a fresh instance (``Trainer(model, opt).train(loader)``) is that class's;
    # a name bound twice is no class of its own
    assert [m.resolve_call(c) for c in _calls(m, "Child().setup")] == [setup]
    assert [m.resolve_call(c) for c in _calls(m, "Either().setup")] == [None]


def test_is_ddp_code():
    assert is_ddp_code(_m("import torch.distributed as dist\n"))
    assert is_ddp_code(_m("from torch.nn.parallel import DistributedDataParallel\n"))
    assert is_ddp_code(_m("import torch\n\ndef f():\n    torch.distributed.barrier()\n"))
    assert is_ddp_code(_m("import torch.nn as nn\nm = nn.parallel.DistributedDataParallel(m)\n"))
    assert not is_ddp_code(_m("import torch\nimport torch.nn as nn\nm = nn.DataParallel(m)\n"))
    # a name below the DDP class is not DDP code; a relative module of that name neither
    assert not is_ddp_code(_m("from torch.nn.DistributedDataParallel.sub import y\n"))
    assert not is_ddp_code(_m("from .distributed import helper\n"))


def test_call_reaches_asks_the_call_not_its_arguments():
    m = _m(
        """
        import torch.distributed as dist

        def evaluate(model):
            dist.all_reduce(model)
            return 1

        print(evaluate(model))
        dist.barrier()
        """
    )
    assert call_reaches(m, _calls(m, "evaluate")[0]) == "evaluate() -> all_reduce()"
    assert call_reaches(m, _calls(m, "print")[0]) is None
    assert call_reaches(m, _calls(m, "dist.barrier")[0]) == "barrier()"


# --------------------------------------------------------------------------- ranks


def test_mentions_local_rank():
    assert mentions_local_rank(_m("import os\nr = os.environ['LOCAL_RANK']\n"))
    assert mentions_local_rank(_m("def f(local_rank=0):\n    pass\n"))
    assert mentions_local_rank(_m("configure(local_rank=1)\n"))
    assert mentions_local_rank(_m('x = "\\x6cocal_rank"\n'))  # an escape spells it
    assert mentions_local_rank(_m("\uff4cocal_rank = 0\n"))  # NFKC: Python reads local_rank
    assert mentions_local_rank(_m('def f():\n    """Reads LOCAL_RANK."""\n'))
    assert not mentions_local_rank(_m("# local_rank in a comment\nx = 1\n"))
    assert not mentions_local_rank(_m('x = f"{a}local_rank"\n'))  # f-string text does not count


def test_splits_ranks():
    def test_of(src):
        m = _m(src)
        return m, m.nodes(ast.If)[0].test

    for src, expected in [
        ("if rank == 0:\n    pass\n", True),
        ("if args.local_rank in [-1, 0]:\n    pass\n", True),
        ("if args.local_rank not in [-1, 0]:\n    pass\n", True),
        ("if args.local_rank != -1:\n    pass\n", False),  # distributed or not: the same on every rank
        ("if args.local_rank == -1 and args.evaluate:\n    pass\n", False),
        ("if args.local_rank != -1 and rank == 0:\n    pass\n", True),
        ("if world_size > 1:\n    pass\n", False),
    ]:
        m, test = test_of(src)
        assert splits_ranks(m, test) is expected, src
    m = _m("if args.local_rank != -1:\n    if rank == 0:\n        dist.barrier()\n")
    call = m.nodes(ast.Call)[0]
    assert [m.source(a.test) for a, _b in rank_split_conditionals(m, call)] == ["rank == 0"]


# --------------------------------------------------------------------------- wraps


def test_type_refs_resolve_isinstance():
    """``isinstance`` is a type check only when it is the builtin (it once went by spelling)."""
    m = _m("import torch.nn as nn\n\ndef unwrap(m, isinstance):\n    return isinstance(m, nn.DataParallel)\n")
    assert dp_type_refs(m) == []
    m = _m("import torch.nn as nn\nx = isinstance(m, (nn.DataParallel, nn.Module))\n")
    assert len(dp_type_refs(m)) == 1


def test_dp_loss_means_and_elif():
    m = _m(
        """
        if args.n_gpu > 1:
            loss = loss.mean()
        if n_gpu > 1: loss = loss.mean()
        if torch.cuda.device_count() > 1:
            a = a.mean(); b = b.mean()
        if n_gpu > 1:
            loss = other.mean()
        if n_gpu > 1:
            loss = loss.mean()
            print(loss)
        if x:
            pass
        elif world_size > 1:
            loss = loss.mean()
        else:
            if n_gpu > 1:
                loss = loss.mean()
        """
    )
    found = dp_loss_means(m)
    assert [n.lineno for n in found] == [2, 4, 5, 14, 17]
    assert [is_elif(m, n) for n in found] == [False, False, False, True, False]


def test_runs_undistributed_only():
    m = _m(
        """
        if args.local_rank == -1 and args.evaluate:
            a()
        if args.local_rank != -1:
            b()
        else:
            c()
        if rank == 0:
            d()
        if x == -1:
            e()
        """
    )
    from dp2ddp.model.ranks import runs_undistributed_only

    got = {m.source(c.func): runs_undistributed_only(m, c) for c in m.nodes(ast.Call)}
    assert got == {"a": True, "b": False, "c": True, "d": False, "e": False}


def test_unguarded_reaching_functions():
    """A barrier the function itself runs under a rank test (HF's load_and_cache_examples)
    is not reached by every caller; an unconditional one is."""
    from dp2ddp.model.collectives import reaching_functions, unguarded_reaching_functions

    m = _m(
        """
        import torch.distributed as dist

        def load(args):
            if args.local_rank not in [-1, 0]:
                dist.barrier()
            return 1

        def evaluate(args):
            return load(args)

        def sync():
            dist.barrier()

        def step():
            sync()
        """
    )
    names = lambda d: sorted(f.name for f in d)  # noqa: E731
    assert names(reaching_functions(m)) == ["evaluate", "load", "step", "sync"]
    assert names(unguarded_reaching_functions(m)) == ["step", "sync"]


def test_source_is_get_source_segment():
    """``source`` reads the cached lines; it gives what ``ast.get_source_segment`` does."""
    src = "x = 'é' + f(a,\n      b)  # c\r\ny = {\r  1: 2}\nz = (\n  é\n)\n"
    m = build(src)
    for node in m.nodes(ast.Assign) + m.nodes(ast.Call) + m.nodes(ast.Dict) + m.nodes(ast.Name):
        assert m.source(node) == ast.get_source_segment(src, node), ast.dump(node)


def test_rank_functions_read_nested_returns():
    from dp2ddp.model.ranks import mentions_rank

    m = _m(
        """
        def main_ok():
            def inner():
                return dist.get_rank() == 0
            return inner()

        def other():
            return 1

        if main_ok():
            pass
        if other():
            pass
        """
    )
    tests = [n.test for n in m.nodes(ast.If)]
    assert [mentions_rank(m, t) for t in tests] == [True, False]


def test_mentions_local_rank_in_adjacent_literals():
    assert mentions_local_rank(_m("x = 'local_' 'rank'\n"))
    assert mentions_local_rank(_m("x = ('LOCAL'\n     '_RANK')\n"))
