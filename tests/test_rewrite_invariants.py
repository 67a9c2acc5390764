"""Invariants of every migration the suite knows: the rewrite and `check` agree.

For each migration — every fixture pair's expected output (``fixtures/*/*.out.py``), every
behaviour fixture and every styles-corpus script the rewrite migrates —:

* `dp2ddp check` (the default rules) finds nothing in it, except what the rewrite itself
  warned about on the same file (a warning and a lint finding of the same fact, such as
  DDP106 "set_epoch could not be placed" and DDP002);
* nothing the migration put under ``if <rank 0>:`` reaches a collective, a DDP
  construction or a DDP forward, directly or through the script's own functions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dp2ddp.check.engine import check_bytes
from dp2ddp.migrate import migrate_source
from dp2ddp.registry import select
from tests.invariants import collectives_under_rank_guards

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
OUTPUTS = sorted(FIXTURES.glob("*/*.out.py"))
SOURCES = sorted((FIXTURES / "behaviour").glob("*.py")) + sorted((FIXTURES / "corpus").glob("*.py"))

# a rewrite warning -> the lint codes that report the same fact in its output
SAME_FACT = {
    "DDP106": {"DDP002"},  # no epoch loop found for set_epoch
    "DDP118": {"DDP015"},  # a reduction="sum" loss
}


# migrations known to draw a lint finding: the rule is right and the migration has a gap
# (strict: once the migration is fixed the test passes, and this entry must go)
KNOWN_GAPS: dict = {}


def _id(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"


def _findings(data: bytes, path: str, allowed: set) -> list:
    result = check_bytes(data, path, tuple(c for c in select() if c.startswith("DDP0")))
    assert result.error is None, result.error
    return [f"{d.line}:{d.col} {d.code} {d.message}" for d in result.diagnostics if d.code not in allowed]


@pytest.mark.parametrize("out", OUTPUTS, ids=_id)
def test_fixture_output_is_clean(out: Path) -> None:
    src = out.with_name(out.name.replace(".out.py", ".in.py"))
    warned = {f.code for f in migrate_source(src.read_bytes(), str(src)).migration.warnings}
    allowed = set().union(*(SAME_FACT.get(c, set()) for c in warned)) if warned else set()
    data = out.read_bytes()
    assert _findings(data, str(out), allowed) == []
    assert collectives_under_rank_guards(data, str(out)) == []


def _sources():
    for p in SOURCES:
        gap = KNOWN_GAPS.get(_id(p))
        yield pytest.param(p, id=_id(p), marks=[pytest.mark.xfail(strict=True, reason=gap)] if gap else [])


@pytest.mark.parametrize("src", list(_sources()))
def test_migration_is_clean(src: Path) -> None:
    result = migrate_source(src.read_bytes(), str(src))
    if not result.changed:
        pytest.skip("not migrated (refused, or nothing to migrate): covered by the corpus and behaviour tests")
    warned = {f.code for f in result.migration.warnings}
    allowed = set().union(*(SAME_FACT.get(c, set()) for c in warned)) if warned else set()
    out = src.with_name(src.stem + "_ddp.py")
    assert _findings(result.output, str(out), allowed) == []
    assert collectives_under_rank_guards(result.output, str(out)) == []
