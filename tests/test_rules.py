"""Every rule's Valid/Invalid examples (position and fix included), its gate on every
source we have, every fixture under fixtures/lint, and the rules' metadata."""

from __future__ import annotations

import functools
import textwrap
import unicodedata
from pathlib import Path

import pytest

from dp2ddp.check.analyze import check_source
from dp2ddp.check.engine import check_bytes
from dp2ddp.model.core import build
from dp2ddp.rules import RULES

BY_CODE = {r.code: r for r in RULES}
BY_NAME = {r.name: r for r in RULES}

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "lint"


def _run(rule, src: str):
    return [f for f in rule.run(build(src)) if f.code == rule.code]


EXAMPLES = [(r.code, i) for r in RULES for i in range(len(r.examples))]


@pytest.mark.parametrize("code,index", EXAMPLES, ids=[f"{c}-{'valid' if BY_CODE[c].examples[i].valid else 'invalid'}-{i}" for c, i in EXAMPLES])
def test_rule_examples(code, index):
    """Fixit's Valid/Invalid: a Valid example draws nothing; an Invalid one draws its
    findings, the first over the range it says, and ``--fix`` turns it into ``fixed`` —
    or, without ``fixed``, the finding offers no fix (the ``[*]`` mark is never a promise
    that ``--fix`` then breaks)."""
    rule = BY_CODE[code]
    ex = rule.examples[index]
    findings = _run(rule, ex.source)
    if ex.valid:
        assert not findings, f"{code} flags its Valid example #{index}: {[f.message for f in findings]}\n{ex.source}"
        return
    assert len(findings) == ex.count, f"{code} Invalid #{index}: {[(f.line, f.col + 1) for f in findings]}\n{ex.source}"
    first = findings[0]
    got = ((first.line, first.col + 1), (first.end_line, first.end_col + 1))
    assert got == ((ex.line, ex.col), ex.end), f"{code} Invalid #{index}: the first finding spans {got}\n{ex.source}"
    assert rule.passes_gate(ex.source.encode()), f"the gate of {code} rejects its Invalid #{index}"
    # the same through the pipeline (noqa, positions as printed)
    diags = check_bytes(ex.source.encode(), "t.py", (code,)).diagnostics
    assert [((d.line, d.col), (d.end_line, d.end_col)) for d in diags][:1] == [got]
    if ex.fixed is None:
        if code != "DDP001":  # DDP001's fix is the migration, tested with `rewrite`
            assert not any(d.fixable for d in diags), f"{code} Invalid #{index} is marked fixable: show `fixed`"
        return
    assert rule.fixable and all(d.fixable for d in diags)
    result = check_bytes(ex.source.encode(), "t.py", (code,), fix=True)
    assert result.error is None, result.error
    assert result.output is not None, f"{code} Invalid #{index}: --fix changed nothing"
    assert result.output.decode() == ex.fixed, "the replacement is not the one the example shows"
    assert not check_bytes(result.output, "t.py", (code,)).diagnostics  # fixed means fixed


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_rule_metadata(rule):
    assert rule.code.startswith("DDP0") and len(rule.code) == 6  # DDP1xx belongs to the migration
    assert rule.name == rule.name.lower() and " " not in rule.name and "_" not in rule.name
    assert rule.what and rule.why and rule.fix and rule.message
    assert rule.invalid and rule.valid
    assert all(e.line and e.col and e.end for e in rule.invalid), "an Invalid example says where its finding is, start and end"
    assert bool(rule.fix_safety) == rule.fixable, "a fixable rule documents its fix safety (and only one)"
    if rule.fixable and rule.code != "DDP001":  # DDP001's fix is the migration, tested with `rewrite`
        assert any(e.fixed for e in rule.invalid), "a fixable rule shows its fix on an Invalid example"
    assert rule.gate, "a rule without a gate makes every file parsed"
    assert rule.severity in ("warning", "info")


def test_every_module_in_rules_is_a_rule():
    """Discovery: each module of dp2ddp/rules/ (but base) is one of RULES, named for its code."""
    modules = sorted(p.stem for p in (ROOT / "dp2ddp" / "rules").glob("*.py") if p.stem not in ("__init__", "base"))
    assert len(modules) == len(RULES)
    assert [m.split("_", 1)[0] for m in modules] == [r.code.lower() for r in RULES]


def test_a_module_without_a_rule_is_an_error(tmp_path, monkeypatch):
    """A module dropped into dp2ddp/rules/ is found without being listed anywhere; one that
    defines no RULE stops the import loudly instead of being skipped."""
    import sys

    import dp2ddp.rules as rules

    source = (ROOT / "dp2ddp" / "rules" / "ddp015_sum_reduction.py").read_text()
    (tmp_path / "ddp099_new_rule.py").write_text(source.replace('"DDP015"', '"DDP099"'))
    monkeypatch.setattr(rules, "__path__", [*rules.__path__, str(tmp_path)])
    try:
        assert "DDP099" in [r.code for r in rules.discover()]
        (tmp_path / "ddp098_forgotten.py").write_text("def check(m):\n    return []\n")
        with pytest.raises(rules.RuleModuleError, match="must define RULE"):
            rules.discover()
    finally:
        for name in ("ddp099_new_rule", "ddp098_forgotten"):
            sys.modules.pop(f"dp2ddp.rules.{name}", None)


def test_codes_and_names_unique():
    assert len({r.code for r in RULES}) == len(RULES)
    assert len({r.name for r in RULES}) == len(RULES)
    assert [r.code for r in RULES] == sorted(r.code for r in RULES)


# --------------------------------------------------------------------------- fixtures

CASES = sorted(p for p in FIXTURES.glob("*/*.py") if not p.name.endswith((".in.py", ".out.py")))
FIX_CASES = sorted(FIXTURES.glob("*/*.in.py"))


def _render(diags) -> str:
    from dp2ddp.check.output import offered

    return "".join(
        f"{Path(d.path).name}:{d.line}:{d.col}: {d.code}{' [*]' if offered(d) else ''} {d.message}\n" for d in diags
    )


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.name}" for p in CASES])
def test_fixture(path: Path, regen: bool):
    rule = BY_NAME[path.parent.name]
    result = check_bytes(path.read_bytes(), str(path), [rule.code])
    assert result.error is None, result.error
    got = _render(result.diagnostics)
    golden = path.with_suffix(".txt")
    if regen:
        golden.write_text(got)
    assert golden.exists(), f"missing {golden}; run pytest --regen"
    assert got == golden.read_text()


@pytest.mark.parametrize("path", FIX_CASES, ids=[f"{p.parent.name}/{p.name}" for p in FIX_CASES])
def test_fix_fixture(path: Path, regen: bool):
    rule = BY_NAME[path.parent.name]
    data = path.read_bytes()
    before = check_bytes(data, str(path), [rule.code])
    assert any(d.fixable for d in before.diagnostics), "a fix case must have something to fix"
    result = check_bytes(data, str(path), [rule.code], fix=True)
    assert result.error is None, result.error
    assert result.output is not None and result.output != data
    compile(result.output, str(path), "exec")
    assert not [d for d in result.diagnostics if d.fixable]  # fixed means fixed
    golden = path.with_name(path.name[: -len(".in.py")] + ".out.py")
    if regen:
        golden.write_bytes(result.output)
    assert golden.exists(), f"missing {golden}; run pytest --regen"
    assert result.output == golden.read_bytes()


def test_every_rule_has_a_fixture():
    assert {p.parent.name for p in CASES} >= {r.name for r in RULES}


# --------------------------------------------------------------------------- gates

# spellings a byte-level gate could miss: continuations, comments and form feeds in dotted
# names, escapes and adjacent literals in strings, lone CR line endings, NFKC identifiers
TRICKY = [
    ("DDP006", "import torch.distributed as dist\nmodel = model.cuda(*args)\n"),
    ("DDP006", "import torch.distributed as dist\nmodel = (model  # c\n    .cuda  # c\n    ())\n"),
    ("DDP006", "import torch\nimport torch.distributed as dist\ndevice = torch.device(\"\\x63uda\")\n"),
    ("DDP006", "import torch\nimport torch.distributed as dist\ndevice = torch.device(\"cu\" \"da\")\n"),
    ("DDP006", "import torch\nimport torch.distributed as dist\ndevice = torch.device(\"cu\"\n    'da:0')\n"),
    ("DDP006", "import torch\nimport torch.distributed as dist\nx = t.to(device='cuda:0')\n"),
    ("DDP006", "import torch.distributed as dist\ndef f(device=\"cuda\"):\n    pass\n"),
    ("DDP006", 'import torch.distributed as dist\n\nclass A(B, device="cuda"):\n    pass\n'),
    ("DDP006", "import torch.distributed as dist\nmodel = model.\uff43uda()\n"),
    ("DDP009", "import torch.distributed as dist\nfrom torch.distributed import barrier as b\nif rank == 0:\n    b()\n"),
    ("DDP009", "import torch.distributed as dist\nif x:\n    pass\nelif dist.get_rank() == 0:\n    for i in y:\n        dist.all_reduce(t)\n"),
    ("DDP009", "import torch.distributed as dist\nif (\n    is_main_process()\n    and x[1:2]\n):\n    dist.barrier()\n"),
    ("DDP009", "import os\nimport torch.distributed as dist\nif os.environ['RANK'] == '0':\n    dist.barrier()\n"),
    ("DDP009", "import os\nimport torch.distributed as dist\nif os.environ.get('R' 'ANK') == '0':\n    dist.barrier()\n"),
    ("DDP009", "import os\nimport torch.distributed as dist\nif os.environ.get('\\x52ANK') == '0':\n    dist.barrier()\n"),
    ("DDP009", "import torch.distributed as dist\nif IS_MASTER:\n    dist.barrier()\n"),
    ("DDP009", "import torch.distributed as dist\n\nif ranK == 0:\n    dist.barrier()\n"),
    ("DDP009", "import torch.distributed as dist\nimport torch.distributed.barrier as bar\n\nif rank == 0:\n    bar()\n"),
    ("DDP010", "import torch.distributed as dist\nif n_gpu > 1:\n    loss = loss.mean(\n    )\n"),
    ("DDP010", "import torch.distributed as dist\nif N_GPU > 1:\n    loss = loss.mean()\n"),
    ("DDP010", "import torch.distributed as dist\n\nif world_\u017fize > 1:\n    loss = loss.mean()\n"),
    ("DDP015", "import torch.distributed as dist\nimport torch.nn as nn\nc = nn.MSELoss(reduction = 'sum')\n"),
    ("DDP015", "import torch.distributed as dist\nimport torch.nn as nn\nc = nn.MSELoss(reduction='s' 'um')\n"),
    ("DDP015", 'import torch.distributed as dist\nimport torch.nn as nn\n\ncriterion = nn.CrossEntropyLoss(reduction="\\x73um")\n'),
    ("DDP003", "from torch.utils.data import DataLoader\nl = DataLoader(ds, shuffle = (True), batch_sampler=s)\n"),
    ("DDP011", "import torch.distributed as dist\np.add_argument('--local-rank', type=int)\n"),
    ("DDP011", 'import torch.distributed as dist\nparser.add_argument("--local\\x5frank", type=int, default=0)\n'),
    ("DDP011", 'import torch.distributed as dist\nparser.add_argument("--loc" "al_rank", type=int, default=0)\n'),
    ("DDP007", 'from torch.nn.parallel import DistributedDataParallel as DDP\n\ndev = "\\x63uda"\nmodel = DDP(model)\n'),
    ("DDP004", 'import torch\nfrom \\\n    torch.distributed import init_process_group\n\ninit_process_group("nccl")\ntorch.save(m, "x")\n'),
    ("DDP004", 'import torch\nfrom torch . distributed import init_process_group as ipg\n\nipg("nccl")\ntorch.save(m, "x")\n'),
    ("DDP004", 'import torch\nimport\x0ctorch.distributed as dist\n\ndist.init_process_group("nccl")\ntorch.save(m, "x")\n'),
    ("DDP004", 'import torch\n\n(torch.  # c\n    distributed).init_process_group("nccl")\ntorch.save(m, "x")\n'),
    ("DDP004", "import torch.distributed as dist\rimport torch\r\rdist.init_process_group('nccl')\rtorch.save(m, 'x')\r"),
    ("DDP004", "import torch.distributed as dist\nimport torch\n\ndist.init_process_group('nccl')\ntorch.\uff53ave(m, 'x')\n"),
    ("DDP001", "import torch.nn as nn\n\nmodel = nn.\uff24ataParallel(model)\n"),
    ("DDP001", "import torch.nn as nn\n\nf = lambda m, isinstance: isinstance(m, nn.DataParallel)\n"),
    ("DDP014", "import torch.distributed as dist\rfrom torch.utils.data import DataLoader\rclass T:\r    def run(self):\r        loader = DataLoader(ds, batch_size=32)\r"),
]

ALL_SOURCES = (
    [e.source for r in RULES for e in r.examples]
    + [p.read_text() for p in CASES + FIX_CASES]
    + [s for _c, s in TRICKY]
    + [p.read_text(errors="replace") for p in sorted((ROOT / "fixtures").rglob("*.py")) if "lint" not in p.parts]
    + [p.read_text() for p in sorted((ROOT / "examples").rglob("*.py"))]
)


@pytest.mark.parametrize("code,src", TRICKY, ids=[f"{c}-{i}" for i, (c, _s) in enumerate(TRICKY)])
def test_tricky_spellings_are_found(code, src):
    rule = BY_CODE[code]
    assert _run(rule, src), f"{code} should flag:\n{src}"
    assert rule.passes_gate(src.encode())


@functools.lru_cache(maxsize=None)
def _model(src: str):
    """The model of a source (built once for all rules), ``None`` if it does not parse."""
    try:
        return build(src)
    except (SyntaxError, ValueError):
        return None


def _variants():
    for src in ALL_SOURCES:
        yield src
        yield "def main():\n" + textwrap.indent(src, "    ")


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_gate_is_sound_on_every_source(rule):
    """The gate is a necessary condition: on every example, fixture and tricky spelling
    where the rule reports something, the gate lets the file through — also moved into a
    function, and with the identifiers written in fullwidth letters (NFKC)."""
    fired = 0
    for variant in _variants():
        m = _model(variant)
        if m is not None and rule.run(m):
            fired += 1
            assert rule.passes_gate(variant.encode()), f"{rule.code} gate rejects:\n{variant}"
    assert fired, f"{rule.code} fires on none of the sources"


def test_gate_reads_identifiers_as_python_does():
    """A non-ASCII file is gated after NFKC normalization: ``ｓave`` is ``save``."""
    src = "import torch\nimport torch.distributed as dist\ntorch.\uff53ave(m, 'x')\n"
    assert unicodedata.normalize("NFKC", "\uff53ave") == "save"
    assert BY_CODE["DDP004"].passes_gate(src.encode())
    assert not BY_CODE["DDP004"].passes_gate(b"import torch\nimport torch.distributed as dist\ntorch.sav(m)\n")
    # and the rules read them so too: a fullwidth ``ｄist`` is ``dist``, so this module
    # does destroy its process group (LibCST, which read it as another name, said it did not)
    src = "import torch.distributed as dist\ndist.init_process_group('nccl')\n\uff44ist.destroy_process_group()\n"
    assert not _run(BY_CODE["DDP008"], src)


# --------------------------------------------------------------------------- positions and noqa

# what a line-based reading of the source would get wrong: decorators, continuations,
# form feeds and line separators (not line breaks for Python), noqa on the finding's line
POSITION_CASES = {
    "decorator-in-parentheses": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n\n\n@(\n    staticmethod\n)\ndef f():\n    model = model.cuda()\n",
        [(11, 19, "DDP006")],
    ),
    "decorator-after-a-continued-at": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n@\\\nstaticmethod\ndef f():\n    model = model.cuda()\n",
        [(8, 19, "DDP006")],
    ),
    "noqa-under-a-parenthesized-decorator": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n@(\n  staticmethod)\ndef f():\n    model = model.cuda()  # noqa: DDP006\n"
        "x = model.cuda()\n",
        [(9, 11, "DDP006")],
    ),
    "form-feed-in-a-body": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n\ndef helper():\n    x = 1\n    # page\x0cbreak\n    return 1\n\n"
        "model = model.cuda()  # noqa: DDP006\nx = model.cuda()\n",
        [(12, 11, "DDP006")],
    ),
    "line-separator-in-a-comment": (
        "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\n"
        "dist.destroy_process_group()\n\ndef helper():\n    x = 1\n    # sep \u2028 x\n    return 1\n\n"
        "# noqa: DDP006\nmodel = model.cuda()\n",
        [(12, 15, "DDP006")],
    ),
    "wide-characters-before-the-finding": (
        "import torch.distributed as dist\ndist.init_process_group('nccl')\ndist.destroy_process_group()\n"
        "x = '\u00e9\u00e9'; model = model.cuda()\n",
        [(4, 25, "DDP006")],
    ),
}


@pytest.mark.parametrize("name", sorted(POSITION_CASES))
def test_positions_and_noqa(name):
    src, expected = POSITION_CASES[name]
    diags, _f, _m, err = check_source(src.encode(), "t.py", RULES)
    assert err is None
    assert [(d.line, d.col, d.code) for d in diags] == expected


def test_gates_decide_alike_alone_and_together():
    """The gates of one file share what they found (a word's presence, the absence of a
    string that longer words hold): each rule is a candidate exactly when its gate alone
    lets the file through."""
    from dp2ddp.check.analyze import candidates

    codes = [r.code for r in RULES]
    sources = ALL_SOURCES + [
        "import torch.distributed as dist\nsave_state = 1\nsavepoint(x)\n",
        "import torch.distributed as dist\ndef save_all(): pass\ntorch.save(m)\n",
        "from torch.nn.parallel import DistributedDataParallel\n",
    ]
    for src in sources:
        data = src.encode()
        together = {r.code for r in candidates(data, codes)}
        alone = {r.code for r in RULES if r.passes_gate(data)}
        assert together == alone, src[:200]
