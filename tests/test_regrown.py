"""A method of the wrapped model's class that changes its layers, called through the wrapper
after the wrap (model/rebound_wrappers.regrown_after_wrap): refused with DDP117; a method
that changes only values (a fade-in's alpha, a cache) is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from dp2ddp.migrate import migrate_source

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "wrap_ddp" / "noop_progressive_model_grown_after_the_wrap.in.py"


def _codes(source: str):
    result = migrate_source(source.encode(), "train.py")
    return result, {f.code: f.message for f in result.migration.findings if f.severity == "error"}


def test_a_method_that_only_changes_values_migrates() -> None:
    source = FIXTURE.read_text().replace("                self.G.module.grow_network()\n", "")
    result, errors = _codes(source)
    assert not errors, errors
    assert b"DistributedDataParallel(" in result.output


@pytest.mark.parametrize("body,line", [
    ("        self.add_module('extra', nn.Linear(16, 16))\n", "self.add_module('extra', nn.Linear(16, 16))"),
    ("        self.model = nn.Sequential(self.model, nn.Linear(16, 16))\n", "self.model = nn.Sequential(self.model, nn.Linear(16, 16))"),
])
def test_a_method_that_changes_the_layers_is_refused(body: str, line: str) -> None:
    source = FIXTURE.read_text()
    start = source.index("    def grow_network(self):\n")
    end = source.index("    def update_alpha")
    source = source[:start] + "    def grow_network(self):\n" + body + "\n" + source[end:]
    result, errors = _codes(source)
    assert "DDP117" in errors, errors
    assert "`self.G.module.grow_network()` changes the model's layers after it is wrapped" in errors["DDP117"]
    assert line[:40] in errors["DDP117"]  # the message shows its first 50 characters
    assert not result.changed
