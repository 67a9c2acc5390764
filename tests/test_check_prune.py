"""Source pruning (dp2ddp.prune_source) never changes what `dp2ddp check` reports.

Every rule example, lint fixture and tricky spelling, as is and moved into functions and
methods next to unrelated ones, is checked with pruning and without: the diagnostics
must be identical. Hand-written cases cover what the rules read outside the function
that holds a finding (callers, set_device elsewhere, a destroy elsewhere, DDP-wrapped
attributes, module-level loaders) and the line-preserving replacement itself."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from dp2ddp import lint
from dp2ddp.prefilter import Prefilter
from dp2ddp.prune_source import prune
from dp2ddp.rules import RULES

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = sorted((ROOT / "fixtures" / "lint").rglob("*.py"))
DEFAULT = tuple(r.code for r in RULES if r.default)
ALL = tuple(r.code for r in RULES)

UNRELATED = "\n\ndef _unrelated(x):\n    y = x + 1\n    return y\n\n\nclass _Other:\n    def m(self):\n        return 2\n"


def _variants(src: str):
    """``src``; with unrelated functions around; its body inside a function; inside a method."""
    body = textwrap.indent(src, "    ")
    yield src
    yield src + UNRELATED
    yield "def main():\n" + body + UNRELATED
    yield "class Trainer:\n    def run(self):\n" + textwrap.indent(src, "        ") + UNRELATED + "\nTrainer().run()\n"


def _sources():
    from tests.test_rules import TRICKY

    out = []
    for r in RULES:
        for kind in ("invalid", "valid"):
            for i, src in enumerate(getattr(r, kind)):
                out.append((f"{r.code}-{kind}-{i}", src))
    for p in FIXTURES:
        out.append((f"{p.parent.name}/{p.name}", p.read_text()))
    for i, (code, src) in enumerate(TRICKY):
        out.append((f"tricky-{code}-{i}", src))
    return out


def _lint(src: str, codes, pruning: bool, monkeypatch):
    monkeypatch.setattr(lint, "PRUNE", pruning)
    r = lint.lint_bytes(src.encode(), "t.py", codes)
    return [(d.line, d.col, d.end_line, d.end_col, d.code, d.message, d.fixable) for d in r.diagnostics], r.error


def _same(src: str, codes, monkeypatch):
    assert _lint(src, codes, True, monkeypatch) == _lint(src, codes, False, monkeypatch), src


@pytest.mark.parametrize("name,src", _sources(), ids=[n for n, _s in _sources()])
def test_pruned_equals_full(name, src, monkeypatch):
    for variant in _variants(src):
        try:
            ast.parse(variant)
        except SyntaxError:
            continue
        for codes in (DEFAULT, ALL):
            _same(variant, codes, monkeypatch)
        for r in RULES:
            _same(variant, (r.code,), monkeypatch)


# what a rule reads outside the function that holds its finding
CONTEXT = {
    "callers-guarded": """
        import torch
        import torch.distributed as dist

        def save(model):
            torch.save(model.state_dict(), "m.pt")

        def unrelated():
            return 1

        def main(rank):
            dist.init_process_group("gloo")
            if rank == 0:
                helper()

        def helper():
            save(model)
        """,
    "callers-unguarded": """
        import torch
        import torch.distributed as dist

        def save(model):
            torch.save(model.state_dict(), "m.pt")

        def helper():
            save(model)

        def main(rank):
            dist.init_process_group("gloo")
            if rank == 0:
                helper()
            helper()
        """,
    "set-device-elsewhere": """
        import torch
        import torch.distributed as dist

        def setup(local):
            torch.cuda.set_device(local)

        def build():
            return Net().cuda()
        """,
    "set-device-alias": """
        import torch.distributed as dist
        from torch.cuda import set_device as pick

        def setup(n):
            pick(n)

        def build():
            return Net().cuda()
        """,
    "local-rank-string-elsewhere": """
        import os
        import torch.distributed as dist

        def env():
            return os.environ["LOCAL_RANK"]

        def build():
            return Net().cuda()
        """,
    "destroy-elsewhere": """
        import torch.distributed as dist

        def main():
            dist.init_process_group("nccl")

        def cleanup():
            dist.destroy_process_group()
        """,
    "destroy-through-a-local-import": """
        import torch.distributed as dist

        def main():
            dist.init_process_group("nccl")

        def cleanup():
            import torch.distributed as td
            td.destroy_process_group()
        """,
    "destroy-imported-in-function": """
        import torch.distributed as dist

        def main():
            dist.init_process_group("nccl")

        def cleanup():
            from torch.distributed import destroy_process_group as d
            d()
        """,
    "ddp-code-only-in-a-function": """
        import torch

        def load():
            return torch.load("x.pt")

        def other():
            import torch.distributed as dist
            dist.barrier()
        """,
    "ddp-code-by-use-only": """
        import torch

        def load():
            return torch.load("x.pt")

        def other():
            torch.distributed.barrier()
        """,
    "cuda-elsewhere": """
        from torch.nn.parallel import DistributedDataParallel as DDP

        def wrap(m):
            return DDP(m)

        def place(m):
            return m.to("cuda:1")
        """,
    "ddp-forward-in-another-method": """
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        class Trainer:
            def setup(self):
                self.net = DDP(self.model)

            def log(self):
                print("x")

            def evaluate(self, batch):
                if self.rank == 0:
                    return self.net(batch)
        """,
    "collective-alias": """
        import torch.distributed as dist
        from torch.distributed import barrier as sync

        def f(rank):
            if rank == 0:
                sync()

        def g():
            return 1
        """,
    "module-loader-used-in-function": """
        from torch.utils.data import DataLoader, DistributedSampler

        loader = DataLoader(ds, sampler=DistributedSampler(ds))

        def train():
            for epoch in range(3):
                for b in loader:
                    step(b)

        def other():
            return 2
        """,
    "set-epoch-in-callee-of-callee": """
        from torch.utils.data import DataLoader, DistributedSampler

        loader = DataLoader(ds, sampler=DistributedSampler(ds))

        def reseed(e):
            loader.sampler.set_epoch(e)

        def begin(e):
            reseed(e)

        for epoch in range(3):
            begin(epoch)
            for b in loader:
                step(b)
        """,
    "global-rebinds-a-module-name": """
        import torch
        dist = None

        def setup():
            global dist
            import torch.distributed as dist

        def main():
            dist.init_process_group("nccl")
            torch.save(m, "x")
        """,
    "global-rebinds-a-builtin": """
        import torch
        import torch.distributed as dist

        def setup():
            global isinstance
            isinstance = lambda *a: True

        def main():
            dist.init_process_group("nccl")
            torch.save(m, "x")
        """,
    "global-of-a-plain-module-name": """
        import torch
        import torch.distributed as dist
        counter = 0

        def bump():
            global counter
            counter = counter + 1

        def main():
            dist.init_process_group("nccl")
            torch.save(m, "x")
        """,
    "nonlocal-in-kept-and-blanked-functions": """
        import torch
        import torch.distributed as dist

        def main():
            dist = None
            def rebind():
                nonlocal dist
                import torch.distributed as dist
            rebind()
            dist.init_process_group("nccl")
            torch.save(m, "x")

        def unrelated():
            n = 0
            def inc():
                nonlocal n
                n += 1
            return inc

        def two_levels():
            dist = None
            def outer():
                def inner():
                    nonlocal dist
                    import torch.distributed as dist
                inner()
            outer()
            dist.init_process_group("gloo")
        """,
    "a-name-below-ddp-is-no-ddp-code": """
        from torch.nn.DistributedDataParallel.sub import y
        import torch


        def f():
            x = 1
            torch.distributed.barrier()


        torch.save(model, "x")
        torch.load("x")
        model = model.cuda()
        """,
    "local-rank-parameter-in-a-nested-function": """
        import torch
        import torch.distributed as dist

        dist.init_process_group("nccl")


        def outer():
            x = 1
            def main(local_rank=0):
                return x


        model = model.cuda()
        """,
    "local-rank-keyword-argument": """
        import torch
        import torch.distributed as dist

        dist.init_process_group("nccl")


        def helper():
            x = 1
            configure(local_rank=x)


        model = model.cuda()
        """,
    "local-rank-spelled-with-an-escape": """
        import torch
        import torch.distributed as dist

        dist.init_process_group("nccl")


        def helper():
            x = 1
            return "\\x6cocal_rank"


        model = model.cuda()
        """,
    "noqa-and-one-liners": """
        import torch.distributed as dist
        def a(): return 1
        def b(x):
            return x  # unrelated
        def main():
            dist.init_process_group("nccl")  # noqa: DDP008
            dist.init_process_group("gloo")
        """,
    "nested-functions": """
        import torch
        import torch.distributed as dist

        def outer():
            def unrelated():
                return 1

            def inner():
                torch.save(m, "x")

            if dist.get_rank() == 0:
                inner()
            return unrelated()
        """,
}


@pytest.mark.parametrize("name", sorted(CONTEXT))
def test_pruned_equals_full_on_context_cases(name, monkeypatch):
    src = textwrap.dedent(CONTEXT[name])
    for variant in (src, src.replace("\n", "\r\n")):
        for codes in (DEFAULT, ALL):
            _same(variant, codes, monkeypatch)
        for r in RULES:
            _same(variant, (r.code,), monkeypatch)


def _pruned(src: str, codes=DEFAULT) -> str:
    data = src.encode()
    rules, facts = Prefilter([r for r in RULES if r.code in codes]).analyse(data)
    out = prune(data, facts, rules)
    return (out or data).decode()


def test_pruning_blanks_unrelated_bodies_and_keeps_every_line():
    # (a destroy the pre-filter is not sure of: a module-level one means the file is not parsed)
    src = textwrap.dedent(CONTEXT["destroy-through-a-local-import"]) + UNRELATED
    out = _pruned(src)
    assert len(out.splitlines()) == len(src.splitlines())
    assert "y = x + 1" not in out and "return 2" not in out  # the unrelated bodies are gone
    assert "    ...\n" in out
    for a, b in zip(src.splitlines(), out.splitlines()):
        assert b in (a, "") or b.strip() == "..."
    # what DDP008 reads stays
    assert 'dist.init_process_group("nccl")' in out and "td.destroy_process_group()" in out


def test_pruning_keeps_callers_for_rules_that_follow_calls():
    out = _pruned(textwrap.dedent(CONTEXT["callers-guarded"]))
    assert "save(model)" in out and "helper()" in out  # helper calls save; main calls helper
    assert "return 1" not in out  # unrelated


def test_pruning_leaves_global_and_one_liners_alone():
    out = _pruned(textwrap.dedent(CONTEXT["global-rebinds-a-module-name"]))
    assert "global dist" in out
    out = _pruned(textwrap.dedent(CONTEXT["global-rebinds-a-builtin"]))
    assert "global isinstance" in out


def test_pruning_blanks_globals_the_rules_never_resolve_and_follows_nonlocal():
    """``global counter`` only binds a name no rule resolves to a qualified name; a
    ``nonlocal`` is kept exactly when the function whose name it binds is."""
    out = _pruned(textwrap.dedent(CONTEXT["global-of-a-plain-module-name"]))
    assert "global counter" not in out and 'dist.init_process_group("nccl")' in out
    out = _pruned(textwrap.dedent(CONTEXT["nonlocal-in-kept-and-blanked-functions"]))
    assert "nonlocal dist" in out  # main is kept: the rebinding in rebind() stays
    assert "nonlocal n" not in out  # unrelated() is blanked, inc() with it
    assert out.count("nonlocal dist") == 2  # inner() rebinds two_levels()'s dist through outer()
    out = _pruned(textwrap.dedent(CONTEXT["noqa-and-one-liners"]))
    assert "def a(): return 1" in out and "return x  # unrelated" not in out


def test_a_body_that_starts_with_a_decorated_definition_is_blanked_from_its_decorator():
    """``ast`` puts a decorated ``def`` on its ``def`` line; blanking from there once left
    the decorator dangling (torch's rpc_test.py), so LibCST re-parsed the whole file."""
    src = textwrap.dedent(CONTEXT["destroy-through-a-local-import"]) + (
        "\n\nclass T:\n    def test_x(self):\n        @decorate(a=1)\n        @other\n"
        "        def inner(self):\n            return 1\n\n        return inner\n"
    )
    out = _pruned(src)
    ast.parse(out)
    assert "@decorate" not in out and "return inner" not in out
    assert len(out.splitlines()) == len(src.splitlines())


def test_no_pruning_when_a_rule_does_not_declare_what_it_reads():
    src = "import torch.nn as nn\n\nmodel = nn.DataParallel(m)\n" + UNRELATED
    assert _pruned(src, ("DDP001",)) == src  # DDP001 keeps everything (its fix reads the module)


def test_fix_never_sees_a_pruned_file(monkeypatch):
    src = "import torch.nn as nn\n\nmodel = nn.DataParallel(m)\n" + UNRELATED
    monkeypatch.setattr(lint, "PRUNE", True)
    r = lint.lint_bytes(src.encode(), "t.py", DEFAULT, fix=True)
    assert r.output is not None and b"y = x + 1" in r.output


def test_dotted_name_patterns_do_not_backtrack_on_comments():
    """A comment full of ``#`` after a name head once made the pattern exponential."""
    import time

    src = (
        "import torch.distributed as dist\n\ndef main():\n    dist.init_process_group('nccl')\n\n"
        "def other():\n    x = (dist  " + "#" * 60 + "\n    )\n"
    )
    t = time.perf_counter()
    _pruned(src)
    assert time.perf_counter() - t < 5


# what LibCST's PositionProvider and str-based line handling would get wrong on their own:
# source, and the (line, code) of what is reported
REFERENCE_CASES = {
    "decorator-in-parentheses": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n\n\n@(\n    staticmethod\n)\ndef f():\n    model = model.cuda()\n",
        [(11, "DDP006")],
    ),
    "decorator-after-a-continued-at": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n@\\\nstaticmethod\ndef f():\n    model = model.cuda()\n",
        [(8, "DDP006")],
    ),
    "noqa-under-a-parenthesized-decorator": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n@(\n  staticmethod)\ndef f():\n    model = model.cuda()  # noqa: DDP006\n"
        "x = model.cuda()\n",
        [(9, "DDP006")],
    ),
    "form-feed-in-a-blanked-body": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n\ndef helper():\n    x = 1\n    # page\x0cbreak\n    return 1\n\n"
        "model = model.cuda()  # noqa: DDP006\nx = model.cuda()\n",
        [(12, "DDP006")],
    ),
    "line-separator-in-a-blanked-body": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n\ndef helper():\n    x = 1\n    # sep \u2028 x\n    return 1\n\n"
        "# noqa: DDP006\nmodel = model.cuda()\n",
        [(12, "DDP006")],
    ),
}


@pytest.mark.parametrize("name", sorted(REFERENCE_CASES))
def test_shortcuts_equal_the_reference_run(name, monkeypatch):
    """Every shortcut of check (ast tier, pruning, positions by statement) against
    DP2DDP_REFERENCE (none of them): the same diagnostics, on the right lines, with
    ``# noqa`` read on the line LibCST counts."""
    src, expected = REFERENCE_CASES[name]
    fast = _lint(src, ALL, True, monkeypatch)
    assert [(d[0], d[4]) for d in fast[0]] == expected
    monkeypatch.setattr(lint, "REFERENCE", True)
    assert fast == _lint(src, ALL, False, monkeypatch)
