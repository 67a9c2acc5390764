"""The edit engine (dp2ddp/engine.py): edits nest, and an edit that would drop another fails."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as cm
import pytest

from dp2ddp.engine import Guard, Hoist, InsertBefore, OverlappingEdits, Replace, apply_edits

SOURCE = "x = 1\n# the result\nprint(load(path), 2)\n"


def _nodes(module: cst.Module):
    stmt = module.body[1]
    call = cm.findall(stmt, cm.Call(func=cm.Name("load")))[0]
    return stmt, call


def _add_kwarg(u: cst.Call) -> cst.Call:
    return u.with_changes(args=[*u.args, cst.Arg(cst.Name("cpu"), keyword=cst.Name("map_location"))])


def test_a_hoisted_call_keeps_the_edits_made_inside_it_and_the_statement_s_comment() -> None:
    module = cst.parse_module(SOURCE)
    stmt, call = _nodes(module)
    out = apply_edits(module, [Hoist(call, stmt, "load_result"), Replace(call, _add_kwarg),
                               InsertBefore(stmt, (cst.parse_statement("step()\n"),))]).code
    assert out == "x = 1\nstep()\n# the result\nload_result = load(path, map_location = cpu)\nprint(load_result, 2)\n"


def test_a_replacement_made_from_the_original_node_over_an_edited_child_fails_instead_of_dropping_it() -> None:
    module = cst.parse_module(SOURCE)
    stmt, call = _nodes(module)
    outer = stmt.body[0].value  # print(...)
    with pytest.raises(OverlappingEdits, match="print\\(load\\(path\\), 2\\)"):
        apply_edits(module, [Replace(call, _add_kwarg), Replace(outer, cst.parse_expression("print(0)"))])
    # made from the updated node, both edits stay
    out = apply_edits(module, [Replace(call, _add_kwarg),
                               Replace(outer, lambda u: cst.parse_expression("guard(0)").with_changes(args=u.args))]).code
    assert "guard(load(path, map_location = cpu), 2)" in out


def test_a_guard_that_cannot_be_put_around_its_statement_fails_instead_of_vanishing() -> None:
    """An ``elif`` sits in its ``if``'s ``orelse``, in no block of statements: a rank test put
    around it was dropped without a word, and the save it held ran on every rank."""
    module = cst.parse_module("if a:\n    f()\nelif b:\n    save()\n")
    elif_ = module.body[0].orelse
    test = cst.parse_expression("rank == 0")
    with pytest.raises(OverlappingEdits, match="elif b:|if b:"):
        apply_edits(module, [Guard((elif_,), test)])
    inner = elif_.body.body[0]  # the statement inside the branch can be guarded
    out = apply_edits(module, [Guard((inner,), test)]).code
    assert out == "if a:\n    f()\nelif b:\n    if rank == 0:\n        save()\n"


# RemoveImportIfUnused runs LibCST's RemoveImportsVisitor over the module with the top-level
# compound statements that cannot bear on the names stubbed out (dp2ddp/engine.py:
# _remove_imports): each case below hides its only use inside such a statement.
@pytest.mark.parametrize("use, kept", [
    ("def f():\n    return 1\n", False),  # used nowhere: dropped, every body stubbed
    ("def f():\n    return DP(1)\n", True),  # used only inside a function body
    ("class C:\n    def f(self) -> 'DP':\n        pass\n", True),  # in a string annotation
    ("for i in range(2):\n    y = [DP]\n", True),  # in a loop body
    ("def f():\n    return DDP(1)\n", False),  # a longer name that contains it is not a use
    ("if x:\n    from torch.nn import DataParallel as DP\n", False),  # a nested import, unused too
    ("if x:\n    from torch.nn import DataParallel as DP\n    DP(1)\n", True),
])
def test_an_import_is_removed_only_where_nothing_uses_it(use: str, kept: bool) -> None:
    from libcst.codemod import CodemodContext
    from libcst.codemod.visitors import RemoveImportsVisitor

    from dp2ddp.engine import RemoveImportIfUnused

    source = "from torch.nn import DataParallel as DP\nimport os\n\n" + use + "\ndef g():\n    return os\n"
    out = apply_edits(cst.parse_module(source), [RemoveImportIfUnused("torch.nn", "DataParallel", "DP")]).code
    assert out.startswith("from torch.nn import DataParallel as DP\n") is kept, out
    assert out.endswith("def g():\n    return os\n")
    # what the visitor gives over the whole module, nothing stubbed
    context = CodemodContext()
    RemoveImportsVisitor.remove_unused_import(context, "torch.nn", "DataParallel", "DP")
    assert out == RemoveImportsVisitor(context).transform_module(cst.parse_module(source)).code


def _statement(module: cst.Module, text: str) -> cst.CSTNode:
    return next(s for s in cm.findall(module, cm.SimpleStatementLine() | cm.If())
                if module.code_for_node(s).strip().startswith(text))


def test_a_removed_statement_keeps_the_comments_above_it() -> None:
    """The comments above a removed statement move to the statement after it, or to the
    end of its block when it was the last; nothing else changes."""
    from dp2ddp.engine import Remove

    source = ("def f(net, n):\n    x = 1\n\n    # parallelise the model\n    if n > 1:\n        net = wrap(net)\n"
              "    net.cuda()\n\n\ndef g(net):\n    y = 2\n    # wrap it\n    net = wrap(net)\n")
    module = cst.parse_module(source)
    out = apply_edits(module, [Remove(_statement(module, "# parallelise")), Remove(_statement(module, "# wrap it"))]).code
    assert out == ("def f(net, n):\n    x = 1\n\n    # parallelise the model\n    net.cuda()\n\n\ndef g(net):\n"
                   "    y = 2\n    # wrap it\n")
    compile(out, "out.py", "exec")


def test_a_statement_moved_elsewhere_takes_its_comment_without_a_copy() -> None:
    from dp2ddp.engine import InsertAfter, Remove

    source = "x = 0\n# make it\nnet = make()\nnet.cuda()\n"
    module = cst.parse_module(source)
    stmt = _statement(module, "# make it")
    out = apply_edits(module, [Remove(stmt), InsertAfter(_statement(module, "net.cuda()"), (stmt,))]).code
    assert out == "x = 0\nnet.cuda()\n# make it\nnet = make()\n"


def test_of_two_guards_the_one_that_holds_the_other_wins_whichever_comes_first() -> None:
    """One transform guards a run of writer uses (``book.append(...)``, ``book.dump()``),
    another the dump alone: the run's guard wins, so the append is not left unguarded on
    ranks where the object is ``None`` (the first guard won before, and it crashed there).
    Guards that only overlap would lose a statement: an error, never written."""
    module = cst.parse_module("a()\nb()\nc()\n")
    a, b, c = module.body
    test = cst.parse_expression("rank == 0")
    for edits in ([Guard((b,), test), Guard((a, b), test)], [Guard((a, b), test), Guard((b,), test)]):
        assert apply_edits(module, edits).code == "if rank == 0:\n    a()\n    b()\nc()\n"
    with pytest.raises(OverlappingEdits):
        apply_edits(module, [Guard((a, b), test), Guard((b, c), test)])
