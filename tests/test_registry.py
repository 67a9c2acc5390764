"""The one registry of every code dp2ddp prints (DDP0xx rules, DDP1xx migration codes):
distinct, documented in docs/rules.md, selectable, and each one can be emitted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dp2ddp.migration_codes import BY_CODE as MIGRATION_CODES
from dp2ddp.check.engine import check_bytes
from dp2ddp.registry import BY_CODE, CODES, UnknownCode, render, select
from dp2ddp.rules import RULES
from tests.data.migration_code_examples import NOT_EMITTED, OPTIONS, PROJECT_MODULES, example

ROOT = Path(__file__).resolve().parent.parent


def test_codes_are_distinct_and_well_formed():
    assert len({c.code for c in CODES}) == len(CODES)
    assert len({c.name for c in CODES}) == len(CODES), "a name selects one code"
    for c in CODES:
        assert re.fullmatch(r"DDP[01]\d\d", c.code), c.code
        assert (c.kind == "rule") == c.code.startswith("DDP0")
        assert c.name == c.name.lower() and re.fullmatch(r"[a-z0-9-]+", c.name), c.name
        assert c.severity in ("info", "warning", "error")
        assert c.message and c.why and c.fix and (c.kind == "rule" or c.fix_safety)
    assert {c.code for c in CODES} == {r.code for r in RULES} | set(MIGRATION_CODES)


def test_every_code_the_migration_prints_is_registered():
    """A DDP1xx literal anywhere in the migration's sources is a registered code."""
    sources = list((ROOT / "dp2ddp" / "codemods").glob("*.py")) + [ROOT / "dp2ddp" / "migrate.py"]
    used = {c for p in sources for c in re.findall(r"[\"'](DDP1\d\d)[\"']", p.read_text())}
    assert used and used <= set(BY_CODE), sorted(used - set(BY_CODE))


def test_docs_rules_md_is_up_to_date():
    text = render()
    for c in CODES:
        assert f"## {c.code}: {c.name}" in text, c.code
        assert f"[{c.code}](#{c.code.lower()}-{c.name})" in text, c.code
    assert (ROOT / "docs" / "rules.md").read_text() == text, "stale docs/rules.md: run `make docs`"


def test_make_docs_writes_the_same():
    out = subprocess.run([sys.executable, "-m", "dp2ddp.registry"], capture_output=True, text=True, check=True).stdout
    assert out == render()


def _codes(*args, **kw):
    return set(select(*args, **kw))


def test_selection():
    rules = {r.code for r in RULES}
    default = _codes()
    assert "DDP013" not in default and "DDP014" not in default and "DDP001" in default
    # the migration's warnings and errors are reported by default, its notes are not
    assert {"DDP101", "DDP105", "DDP107"} <= default and not {"DDP100", "DDP130"} & default
    warnings = {c.code for c in CODES if c.kind == "migration" and c.default}
    assert _codes(["ALL"]) == set(BY_CODE)
    assert _codes(["DDP00"]) == {f"DDP00{i}" for i in range(1, 10)} | warnings
    assert _codes(["DDP00"], ignore=["DDP1"]) == {f"DDP00{i}" for i in range(1, 10)}
    assert _codes(["ALL"], ignore=["DDP01", "DDP02", "DDP1"]) == {f"DDP00{i}" for i in range(1, 10)}
    assert _codes(["DDP002"]) == {"DDP002"}
    assert _codes(["DDP003"]) == {"DDP003"}
    # DDP001's fix is the migration: its warnings and errors come with it, ignorable
    assert _codes(["DDP001,DDP003"]) == {"DDP001", "DDP003"} | warnings
    assert _codes(["DDP001"], ignore=["DDP1"]) == {"DDP001"}
    assert _codes(["DDP001"], ignore=["DDP105"]) == {"DDP001"} | warnings - {"DDP105"}
    assert _codes(["DDP001"], ignore=["DDP"]) == {"DDP001"}  # the more specific selector wins
    assert _codes(["DDP105"]) == {"DDP105"}
    assert _codes(["loader-not-sharded"]) == {"DDP105"}  # by name
    assert _codes(None, ignore=["DDP105"]) == default - {"DDP105"}
    assert _codes(None, extend_select=["DDP13"]) == default | {c for c in BY_CODE if c.startswith("DDP13")}
    assert _codes(["DDP0"]) == rules | warnings
    with pytest.raises(UnknownCode) as e:
        select(["DDP999"])
    assert "DDP001" in str(e.value) and "DDP105" in str(e.value)


# --------------------------------------------------------------------------- every code can be emitted


@pytest.mark.parametrize("code", [r.code for r in RULES])
def test_every_rule_code_is_emitted(code):
    ex = BY_CODE[code].rule.invalid[0]
    assert code in {d.code for d in check_bytes(ex.source.encode(), "t.py", (code,)).diagnostics}


def _migration_params():
    out = []
    for code, mc in sorted(MIGRATION_CODES.items()):
        marks = []
        if code in NOT_EMITTED:
            marks.append(pytest.mark.xfail(strict=True, reason=NOT_EMITTED[code]))
        out.append(pytest.param(code, example(code, mc.example), id=code, marks=marks))
    return out


@pytest.mark.parametrize("code,source", _migration_params())
def test_every_migration_code_is_emitted(code, source, tmp_path):
    """The migration (`rewrite`) draws the code on its example, and `check --fix` reports it
    when it is selected (DDP001's fix is the migration: where DDP001 finds nothing — a
    DataParallel that only a star import may provide, DDP107 — `check` runs no migration).
    An example may need the project's own modules beside it (PROJECT_MODULES)."""
    from dp2ddp.migrate import Options, migrate_bytes

    assert source, f"no example for {code}: add MigrationCode.example or tests/data/migration_code_examples.py"
    path = "train.py"
    if code in PROJECT_MODULES:
        for name, text in PROJECT_MODULES[code].items():
            (tmp_path / name).write_text(text)
        path = str(tmp_path / "train.py")
    migration = migrate_bytes(source.encode(), path, Options(**OPTIONS.get(code, {}))).migration
    assert code in {f.code for f in migration.findings}, [(f.code, f.message) for f in migration.findings]
    if code in OPTIONS or not check_bytes(source.encode(), path, ("DDP001",)).diagnostics:
        return
    result = check_bytes(source.encode(), path, ("DDP001", code), fix=True)
    assert result.error is None, result.error
    assert code in {d.code for d in result.diagnostics}, [(d.code, d.message) for d in result.diagnostics]


def test_libcst_is_within_the_tested_bound():
    """pyproject.toml bounds LibCST (the bridge and the engine use its 1.x API); the
    installed version, which the suite runs against, is inside the bound."""
    from importlib.metadata import version

    text = (ROOT / "pyproject.toml").read_text()
    spec = re.search(r'"libcst([^"]*)"', text).group(1)
    assert ">=1.1" in spec and "<2" in spec, spec
    major, minor = (int(x) for x in version("libcst").split(".")[:2])
    assert (1, 1) <= (major, minor) < (2, 0)
