"""Every rule's VALID/INVALID examples, every fixture under fixtures/lint, and docs/rules.md."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest

from dp2ddp.analysis import Analysis
from dp2ddp import lint
from dp2ddp.lint import lint_bytes
from dp2ddp.prefilter import Prefilter
from dp2ddp.rules import BY_CODE, BY_NAME, RULES, UnknownCode, select_rules

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "lint"


def _run(rule, src: str):
    an = Analysis.from_module(cst.parse_module(src))
    return [f for f in rule.check(an) if f.code == rule.code]


EXAMPLES = [(r.code, kind, i) for r in RULES for kind in ("invalid", "valid") for i in range(len(getattr(r, kind)))]


@pytest.mark.parametrize("code,kind,index", EXAMPLES, ids=[f"{c}-{k}-{i}" for c, k, i in EXAMPLES])
def test_rule_examples(code, kind, index):
    rule = BY_CODE[code]
    src = getattr(rule, kind)[index]
    findings = _run(rule, src)
    if kind == "invalid":
        assert findings, f"{code} misses its INVALID example #{index}:\n{src}"
        # the pre-filter must let every INVALID example through (it is a necessary condition)
        assert rule in Prefilter([rule]).candidates(src.encode()), f"pre-filter rejects {code} INVALID #{index}"
    else:
        assert not findings, f"{code} flags its VALID example #{index}: {[f.message for f in findings]}\n{src}"


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_rule_metadata(rule):
    assert rule.code.startswith("DDP0") and len(rule.code) == 6  # DDP1xx belongs to the migration's notes
    assert rule.name == rule.name.lower() and " " not in rule.name and "_" not in rule.name
    assert rule.what and rule.why and rule.fix_doc and rule.message
    assert rule.invalid and rule.valid
    assert rule.needs, "a rule without needs defeats the pre-filter"


def test_codes_and_names_unique():
    assert len({r.code for r in RULES}) == len(RULES)
    assert len({r.name for r in RULES}) == len(RULES)


def test_selection():
    default = {r.code for r in select_rules()}
    assert "DDP013" not in default and "DDP014" not in default and "DDP001" in default
    assert {r.code for r in select_rules(["ALL"])} == {r.code for r in RULES}
    assert {r.code for r in select_rules(["DDP00"])} == {f"DDP00{i}" for i in range(1, 10)}
    assert {r.code for r in select_rules(["ALL"], ignore=["DDP01"])} == {f"DDP00{i}" for i in range(1, 10)}
    assert {r.code for r in select_rules(["DDP001,DDP003"])} == {"DDP001", "DDP003"}
    # a more specific select beats a broader ignore
    assert {r.code for r in select_rules(["DDP001"], ignore=["DDP"])} == {"DDP001"}
    with pytest.raises(UnknownCode) as e:
        select_rules(["DDP999"])
    assert "DDP001" in str(e.value)


# --------------------------------------------------------------------------- fixtures

CASES = sorted(
    p for p in FIXTURES.glob("*/*.py") if not p.name.endswith(".in.py") and not p.name.endswith(".out.py")
)
FIX_CASES = sorted(FIXTURES.glob("*/*.in.py"))


def _rule_of(path: Path):
    return BY_NAME[path.parent.name]


def _render(diags) -> str:
    return "".join(
        f"{Path(d.path).name}:{d.line}:{d.col}: {d.code}{' [*]' if d.fixable else ''} {d.message}\n" for d in diags
    )


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.name}" for p in CASES])
def test_fixture(path: Path, regen: bool):
    rule = _rule_of(path)
    data = path.read_bytes()
    result = lint_bytes(data, str(path), [rule.code])
    assert result.error is None, result.error
    # the pre-filter is a necessary condition: it never hides a finding the rule makes
    if _run(rule, data.decode()):
        assert rule in Prefilter([rule]).candidates(data)
    got = _render(result.diagnostics)
    golden = path.with_suffix(".txt")
    if regen:
        golden.write_text(got)
    assert golden.exists(), f"missing {golden}; run pytest --regen"
    assert got == golden.read_text()


@pytest.mark.parametrize("path", FIX_CASES, ids=[f"{p.parent.name}/{p.name}" for p in FIX_CASES])
def test_fix_fixture(path: Path, regen: bool):
    rule = _rule_of(path)
    data = path.read_bytes()
    before = lint_bytes(data, str(path), [rule.code])
    assert any(d.fixable for d in before.diagnostics), "a fix case must have something to fix"
    result = lint_bytes(data, str(path), [rule.code], fix=True)
    assert result.error is None, result.error
    assert result.output is not None and result.output != data
    compile(result.output, str(path), "exec")
    # fixed means fixed: no fixable finding of the rule is left
    assert not [d for d in result.diagnostics if d.fixable]
    golden = path.with_name(path.name[: -len(".in.py")] + ".out.py")
    if regen:
        golden.write_bytes(result.output)
    assert golden.exists(), f"missing {golden}; run pytest --regen"
    assert result.output == golden.read_bytes()


def test_every_rule_has_a_fixture():
    covered = {p.parent.name for p in CASES}
    assert covered >= {r.name for r in RULES}


# --------------------------------------------------------------------------- docs


def test_docs_rules_md_is_up_to_date():
    from dp2ddp.rules.docs import render

    text = render()
    for r in RULES:
        assert f"## {r.code}: {r.name}" in text
        assert r.invalid[0].strip() in text
    assert (ROOT / "docs" / "rules.md").read_text() == text, "regenerate: python -m dp2ddp.rules.docs > docs/rules.md"


# --------------------------------------------------------------------------- pre-filter soundness

ALL_SOURCES = [src for r in RULES for kind in ("invalid", "valid") for src in getattr(r, kind)] + [
    p.read_text() for p in CASES + FIX_CASES
]

# spellings the pre-filter's byte patterns and ast shapes must not miss
TRICKY = [
    ("DDP006", "import torch.distributed as dist\nmodel = model.cuda(*args)\n"),
    ("DDP006", "import torch.distributed as dist\nmodel = (model  # c\n    .cuda  # c\n    ())\n"),
    ("DDP006", "import torch\nimport torch.distributed as dist\ndevice = torch.device(\"\\x63uda\")\n"),
    ("DDP006", "import torch\nimport torch.distributed as dist\nx = t.to(device='cuda:0')\n"),
    ("DDP006", "import torch.distributed as dist\ndef f(device=\"cuda\"):\n    pass\n"),
    ("DDP009", "import torch.distributed as dist\nfrom torch.distributed import barrier as b\nif rank == 0:\n    b()\n"),
    ("DDP009", "import torch.distributed as dist\nif x:\n    pass\nelif dist.get_rank() == 0:\n    for i in y:\n        dist.all_reduce(t)\n"),
    ("DDP009", "import torch.distributed as dist\nif (\n    is_main_process()\n    and x[1:2]\n):\n    dist.barrier()\n"),
    ("DDP010", "import torch.distributed as dist\nif n_gpu > 1:\n    loss = loss.mean(\n    )\n"),
    ("DDP015", "import torch.distributed as dist\nimport torch.nn as nn\nc = nn.MSELoss(reduction = 'sum')\n"),
    ("DDP003", "from torch.utils.data import DataLoader\nl = DataLoader(ds, shuffle = (True), batch_sampler=s)\n"),
    ("DDP011", "import torch.distributed as dist\np.add_argument('--local-rank', type=int)\n"),
    # the rank and GPU-count words are matched in any case
    ("DDP009", "import os\nimport torch.distributed as dist\nif os.environ['RANK'] == '0':\n    dist.barrier()\n"),
    ("DDP009", "import torch.distributed as dist\nif IS_MASTER:\n    dist.barrier()\n"),
    ("DDP010", "import torch.distributed as dist\nif N_GPU > 1:\n    loss = loss.mean()\n"),
]


@pytest.mark.parametrize("code,src", TRICKY, ids=[f"{c}-{i}" for i, (c, _s) in enumerate(TRICKY)])
def test_prefilter_lets_tricky_spellings_through(code, src):
    rule = BY_CODE[code]
    assert _run(rule, src), f"{code} should flag:\n{src}"
    assert rule in Prefilter([rule]).candidates(src.encode())
    assert rule in Prefilter(RULES).candidates(src.encode())


# where the pre-filter *rejects* a file because something certainly silences the rule
# (a destroy_process_group reference, a set_device call, a local-rank string): the near
# misses, where the silencer is not certain for LibCST, must still be let through
SILENCER_EDGES = [
    # the silencer is used before the import, shadowed, rebound or only looks like one
    "import torch.distributed as dist\ndist.init_process_group('gloo')\ndef f(dist):\n    dist.destroy_process_group()\n",
    "import torch.distributed as dist\ndist.init_process_group('gloo')\nclass C:\n    import os as dist\n    dist.destroy_process_group\n",
    "import torch.distributed as dist\nimport os as d\ndist.init_process_group('gloo')\nd.destroy_process_group()\n",
    "import torch.distributed as dist\ndist.init_process_group('gloo')\n[dist.destroy_process_group() for dist in x]\n",
    "import torch.distributed as dist\ndist.init_process_group('gloo')\n(dist := x).destroy_process_group()\n",
    "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\nm = m.cuda()\ndef g(torch):\n    torch.cuda.set_device(0)\n",
    "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\nm = m.cuda()\ntorch.cuda.set_device\n",
    "import torch.distributed as dist\ndist.init_process_group('nccl')\nm = m.cuda()\nx = 'local_' 'rank'\n",
    "import torch.distributed as dist\ndist.init_process_group('nccl')\nm = m.cuda()\nx = f\"{a}'local_rank'\"\n",
    "import torch.distributed as dist\ndist.init_process_group('nccl')\nm = m.cuda()\nx = b'local_rank'\n",
    # ast applies NFKC to identifiers (a fullwidth "ｄist" is "dist" there), LibCST does not
    "import torch.distributed as dist\ndist.init_process_group('nccl')\n\uff44ist.destroy_process_group()\n",
    "import torch.distributed as dist\nfrom torch.distributed import \uff44estroy_process_group\ndist.init_process_group('nccl')\n",
    "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\ntorch.cuda.\uff53et_device(0)\nm = m.cuda()\n",
    "import torch.distributed as dist\ndist.init_process_group('nccl')\n\uff4cocal_rank = 0\nm = m.cuda()\n",
]
# ... and these the pre-filter may reject (what LibCST certainly resolves)
SILENCED = [
    ("DDP008", "import torch.distributed as dist\ndist.init_process_group('gloo')\ndef f():\n    dist.destroy_process_group()\n"),
    ("DDP008", "import torch\ntorch.distributed.init_process_group('gloo')\natexit.register(torch.distributed.destroy_process_group)\n"),
    ("DDP008", "import torch.distributed as dist\nfrom torch.distributed import destroy_process_group\ndist.init_process_group('gloo')\n"),
    ("DDP006", "import torch\nimport torch.distributed as dist\ndist.init_process_group('nccl')\nm = m.cuda()\ndef g():\n    torch.cuda.set_device(0)\n"),
    ("DDP006", "import torch.distributed as dist\ndist.init_process_group('nccl')\nm = m.cuda()\nr = os.environ['LOCAL_RANK']\n"),
    ("DDP006", 'import torch.distributed as dist\ndist.init_process_group("nccl")\nm = m.cuda()\ndef f():\n    """Reads\n    LOCAL_RANK."""\n'),
]


@pytest.mark.parametrize("src", SILENCER_EDGES, ids=[f"edge-{i}" for i in range(len(SILENCER_EDGES))])
def test_prefilter_lets_uncertain_silencers_through(src):
    fired = [r for r in (BY_CODE["DDP006"], BY_CODE["DDP008"]) if _run(r, src)]
    assert fired, "an edge case must be one where LibCST reports"
    for rule in fired:
        assert rule in Prefilter([rule]).candidates(src.encode()), f"{rule.code}:\n{src}"


@pytest.mark.parametrize("code,src", SILENCED, ids=[f"{c}-{i}" for i, (c, _s) in enumerate(SILENCED)])
def test_prefilter_rejects_certainly_silenced_files(code, src):
    rule = BY_CODE[code]
    assert not _run(rule, src)  # LibCST agrees there is nothing to report...
    assert rule not in Prefilter([rule]).candidates(src.encode())  # ... and it is not even parsed


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_prefilter_is_sound_on_every_example_and_fixture(rule):
    """Every rule over every example and fixture of every rule: when it finds something,
    the pre-filter (alone or with all rules) lets the file through."""
    both = Prefilter(RULES)
    alone = Prefilter([rule])
    for src in ALL_SOURCES:
        try:
            findings = _run(rule, src)
        except cst.ParserSyntaxError:
            continue
        if findings:
            assert rule in alone.candidates(src.encode()), src
            assert rule in both.candidates(src.encode()), src


# spellings that once slipped past the pre-filter or the pruning (a review against the
# rules run on the whole file): continuations, form feeds and comments in dotted names,
# escapes, lone CR line endings, Unicode case folding, shadowed isinstance, class keyword
# arguments, `import a.b.f as x`, parenthesised name heads
EXOTIC = [
    (
        "cr_from_imports",
        "from torch import distributed as dist\rfrom torch.utils.data import DataLoader\rclass T:\r"
        "    def run(self):\r\r        loader = DataLoader(ds, batch_size=32)\r\r\rT().run()\r",
    ),
    ('attr_comment', 'import torch\n\n(torch.  # c\n    distributed).init_process_group("nccl")\ntorch.save(m, "x")\n'),
    ('attr_ff', 'import torch\n\ntorch.\x0cdistributed.init_process_group("nccl")\ntorch.save(m, "x")\n'),
    ('classarg_ddp006', 'import torch.distributed as dist\n\nclass A(B, device="cuda"):\n    pass\n'),
    ('coll_alias_ddp009', 'import torch.distributed as dist\nimport torch.distributed.barrier as bar\n\nif rank == 0:\n    bar()\n'),
    ('cr_ddp003', 'from torch.utils.data import DataLoader\r\rloader = DataLoader(ds, sampler=s, shuffle  # c\r    = True)\r'),
    ('cr_ddp006', 'import torch.distributed as dist\r\rdist.init_process_group("nccl")\rmodel = (model.cuda  # c\r    )()\r'),
    ('cr_ddp010', 'import torch.distributed as dist\r\rif args.n_gpu > 1:\r    loss = loss.mean(  # c\r    )\rloss.backward()\r'),
    ('cr_ddp015', 'import torch.distributed as dist\rimport torch.nn as nn\r\rc = nn.CrossEntropyLoss(reduction  # c\r    ="sum")\r'),
    ('cr_imp', 'import os, \\\r    torch.distributed as dist\rimport torch\r\rdist.init_process_group("nccl")\rtorch.save(m, "x")\r'),
    ('esc_ddp007', 'from torch.nn.parallel import DistributedDataParallel as DDP\n\ndev = "\\x63uda"\nmodel = DDP(model)\n'),
    ('esc_ddp011', 'import argparse\n\nimport torch.distributed as dist\n\nparser = argparse.ArgumentParser()\nparser.add_argument("--local\\x5frank", type=int, default=0)\n'),
    ('esc_ddp015', 'import torch.distributed as dist\nimport torch.nn as nn\n\ncriterion = nn.CrossEntropyLoss(reduction="\\x73um")\n'),
    ('from_cont', 'import torch\nfrom \\\n    torch.distributed import init_process_group\n\ninit_process_group("nccl")\ntorch.save(m, "x")\n'),
    ('from_cont2', 'import torch\nfrom torch.distributed \\\n    import init_process_group\n\ninit_process_group("nccl")\ntorch.save(m, "x")\n'),
    ('from_spacedot', 'import torch\nfrom torch . distributed import init_process_group as ipg\n\nipg("nccl")\ntorch.save(m, "x")\n'),
    ('getrank_alias_ddp009', 'import torch.distributed as dist\nimport torch.distributed.get_rank as gr\n\nif gr() == 0:\n    dist.barrier()\n'),
    ('imp_cont', 'import torch\nimport \\\n    torch.distributed as dist\n\ndist.init_process_group("nccl")\ntorch.save(m, "x")\n'),
    ('imp_ff', 'import torch\nimport\x0ctorch.distributed as dist\n\ndist.init_process_group("nccl")\ntorch.save(m, "x")\n'),
    ('isinst_lambda_ddp001', 'import torch.nn as nn\n\nf = lambda m, isinstance: isinstance(m, nn.DataParallel)\n'),
    ('isinst_param_ddp001', 'import torch.nn as nn\n\ndef unwrap(m, isinstance):\n    return isinstance(m, nn.DataParallel)\n'),
    ('kelvin_ddp009', 'import torch.distributed as dist\n\nif ranK == 0:\n    dist.barrier()\n'),
    ('longs_ddp010', 'import torch.distributed as dist\n\nif world_ſize > 1:\n    loss = loss.mean()\n'),
    ('prune_ddp004', 'import torch\n\ndef setup():\n    (torch).distributed.init_process_group("nccl")\n\ndef other(torch):\n    pass\n\ntorch.save(m, "x")\n'),
    ('prune_ddp006', 'import torch\nimport torch.distributed as dist\n\ndef setup():\n    (torch.cuda).set_device(0)\n\ndef other(torch):\n    pass\n\ndist.init_process_group("nccl")\nmodel = model.cuda()\n'),
    ('prune_ddp008', 'import torch.distributed as dist\n\ndef cleanup():\n    (dist).destroy_process_group()\n\ndef other(dist):\n    pass\n\ndist.init_process_group("nccl")\n'),
    ('prune_ddp013', 'import torch.distributed as dist\nimport torch.nn as nn\n\ndef build():\n    return (nn).BatchNorm2d(64)\n'),
    ('prune_ddp013b', 'import torch.distributed as dist\nimport torch.nn as nn\n\ndef convert(m):\n    return (nn).SyncBatchNorm.convert_sync_batchnorm(m)\n\nlayer = nn.BatchNorm2d(64)\n'),
    ('prune_ddp014', 'import torch.distributed as dist\nfrom torch.utils import data\n\ndef make(ds):\n    return (data).DataLoader(ds, batch_size=32)\n'),
]


@pytest.mark.parametrize("src", [s for _n, s in EXOTIC], ids=[n for n, _s in EXOTIC])
def test_check_reports_what_the_rules_find_on_exotic_spellings(src):
    """``check`` (pre-filter, pruning, positions by statement) against every rule run on
    the whole file with no shortcut: the same findings, for all rules and for each alone."""
    data = src.encode()
    diags, _f, _an, err = lint._check(data, "t.py", RULES)
    assert err is None
    truth = sorted((d.line, d.col, d.code) for d in diags)  # empty where check once added one
    for codes in [tuple(r.code for r in RULES)] + [(r.code,) for r in RULES]:
        got = sorted((d.line, d.col, d.code) for d in lint.lint_bytes(data, "t.py", codes).diagnostics)
        assert got == [t for t in truth if t[2] in codes], codes
