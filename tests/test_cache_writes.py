"""The cache-write fact (:mod:`dp2ddp.model.cache_writes`): a function whose every write is
of a file a test just found missing. Only then may the other ranks run it after rank 0 and
merely read; anything else it writes, or a path that may change between test and write,
and it is not one."""

from __future__ import annotations

import ast

import pytest

from dp2ddp.model.cache_writes import writes_when_missing
from dp2ddp.model.core import build
from dp2ddp.model.writers import writers

HEAD = "import os, pickle, torch\nfrom pathlib import Path\n\n"


def _func(src: str):
    m = build((HEAD + src).encode(), "t.py")
    return m, next(n for n in m.nodes(ast.FunctionDef) if n.name == "make")


@pytest.mark.parametrize("src", [
    "def make(p):\n    if os.path.exists(p):\n        return torch.load(p)\n    else:\n        x = [1]\n        torch.save(x, p)\n        return x\n",
    "def make(p):\n    if not os.path.isfile(p):\n        with open(p, 'wb') as f:\n            pickle.dump([1], f)\n    with open(p, 'rb') as f:\n        return pickle.load(f)\n",
    "def make(p: Path):\n    if p.exists():\n        x = torch.load(p)\n    else:\n        x = [1]\n        torch.save(x, p)\n    return x\n",
    "class C:\n    def make(self):\n        if not os.path.exists(self.cache):\n            torch.save([1], self.cache)\n        return torch.load(self.cache)\n",
], ids=["exists_else", "not_isfile_with_open_handle", "pathlib_exists", "self_attribute_path"])
def test_a_write_only_where_the_file_is_missing_is_a_cache_write(src: str) -> None:
    m, func = _func(src)
    assert writes_when_missing(m, func, writers(m))


@pytest.mark.parametrize("src", [
    "def make(p):\n    x = [1]\n    torch.save(x, p)\n    return x\n",
    "def make(p, q):\n    if not os.path.exists(q):\n        torch.save([1], p)\n    return torch.load(p)\n",
    "def make(p):\n    if not os.path.exists(p):\n        p = p + '.new'\n        torch.save([1], p)\n    return torch.load(p)\n",
    "def make(p):\n    if os.path.exists(p):\n        torch.save([2], p)\n    return torch.load(p)\n",
    "def make(p):\n    if not os.path.exists(p):\n        torch.save([1], p)\n    os.makedirs('out')\n    return torch.load(p)\n",
    "def make(p):\n    if not os.path.exists(p):\n        torch.save([1], p)\n    torch.save([2], p + '.bak')\n    return torch.load(p)\n",
    "def make(p):\n    return torch.load(p)\n",
], ids=["unconditional", "another_path_tested", "path_rebound_after_the_test", "written_where_it_exists",
        "makes_a_folder_too", "a_second_write_unguarded", "writes_nothing"])
def test_anything_else_is_not(src: str) -> None:
    m, func = _func(src)
    assert not writes_when_missing(m, func, writers(m))
