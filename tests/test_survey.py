"""benchmarks/survey_rewrite.py: classification, structural flags, end to end on tiny files."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def survey():
    spec = importlib.util.spec_from_file_location("survey_rewrite", ROOT / "benchmarks" / "survey_rewrite.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["survey_rewrite"] = mod  # dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("survey_rewrite", None)


SIMPLE = b'''import torch
import torch.nn as nn


def main():
    model = nn.Linear(4, 2)
    model = nn.DataParallel(model)
    for epoch in range(2):
        model(torch.zeros(3, 4)).sum().backward()


if __name__ == "__main__":
    main()
'''

COMMENT_ONLY = b'''# this script used to use nn.DataParallel
x = 1
'''

BROKEN = b"def f(:\n    DataParallel\n"


def test_status(survey):
    R = survey.RewriteOutcome
    assert survey._status(R(True, b"", False, True), 1, True) == "migrated"
    assert survey._status(R(False, b"", True, True, [("DDP101", "error", "m", 1)]), 1, True) == "refused"
    assert survey._status(R(False, b"", False, True, [("DDP105", "warning", "m", 1)]), 1, True) == "warned-only"
    assert survey._status(R(False, b"", False, False), 2, True) == "silent"
    assert survey._status(R(False, b"", False, False), 0, True) == "text-only"
    assert survey._status(R(False, b"", False, False), 0, False) == "no-mention"
    assert survey._status(R(False, b"", False, False, input_error="x:1: syntax error"), None, True) == "parse-error"


def test_mentions(survey):
    assert survey.code_mentions(SIMPLE) == 1
    assert survey.code_mentions(COMMENT_ONLY) == 0
    assert survey.mentions(COMMENT_ONLY)
    assert survey.code_mentions(b"y = nn.parallel.data_parallel(m, x)\n") == 1
    assert not survey.mentions(b"from torch.nn.parallel import DistributedDataParallel\n")
    assert not survey.mentions(b"from torch.distributed.fsdp import FullyShardedDataParallel\n")


def test_normalise(survey):
    assert survey.normalise("cannot tell whether net2 is the model; x") == "cannot tell whether <name> is the model; x"
    assert survey.normalise('fixed device "cuda:1": y') == "fixed device <q>: y"
    assert survey.normalise("DataParallel(dim=1) scatters") == "DataParallel(dim=N) scatters"


def test_structure_flags(survey):
    before = b'''import torch
if __name__ == "__main__":
    model = torch.nn.Linear(2, 2)
    if torch.cuda.device_count() > 1:
        model = torch.nn.DataParallel(model)
    model.train()
'''
    hoisted = b'''import torch
from torch.nn.parallel import DistributedDataParallel
if __name__ == "__main__":
    model = torch.nn.Linear(2, 2)
    model.train()
model = DistributedDataParallel(model)
'''
    right = b'''import torch
from torch.nn.parallel import DistributedDataParallel
if __name__ == "__main__":
    model = torch.nn.Linear(2, 2)
    model = DistributedDataParallel(model)
    model.train()
'''
    assert [f for f in survey.structure_flags(before, hoisted) if f.startswith("wrap-hoisted")]
    assert survey.structure_flags(before, right) == []

    lib = b"import torch\n\ndef wrap(m):\n    return torch.nn.DataParallel(m)\n"
    lib_out = (
        b"import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel\n"
        b"dist.init_process_group('gloo')\n\ndef wrap(m):\n    return DistributedDataParallel(m)\n"
    )
    assert "setup-in-library" in survey.structure_flags(lib, lib_out)

    guarded = b'''import torch.distributed as dist
def main():
    if dist.get_rank() == 0:
        dist.init_process_group("gloo")
        print("hi")
'''
    assert "setup-in-rank-branch" in survey.structure_flags(b"def main():\n    print('hi')\n", guarded)


def test_end_to_end(survey, tmp_path, capsys):
    (tmp_path / "simple.py").write_bytes(SIMPLE)
    (tmp_path / "comment.py").write_bytes(COMMENT_ONLY)
    (tmp_path / "broken.py").write_bytes(BROKEN)
    (tmp_path / "unrelated.py").write_bytes(b"x = 1\n")
    out_json = tmp_path / "survey.json"
    outputs = tmp_path / "outputs"
    assert survey.main([str(tmp_path), "--json", str(out_json), "--write-outputs", str(outputs)]) == 0
    report = json.loads(out_json.read_text())
    rows = {Path(r["path"]).name: r for r in report["rows"]}
    assert set(rows) == {"simple.py", "comment.py", "broken.py"}  # unrelated.py: no mention
    assert rows["broken.py"]["status"] == "parse-error"
    assert rows["comment.py"]["status"] == "text-only"
    simple = rows["simple.py"]
    assert simple["status"] == "migrated"
    assert simple["compiles"] and simple["idempotent"] and simple["residual_dp"] == 0
    assert Path(simple["output_file"]).read_bytes() != SIMPLE
    assert report["summary"]["status"]["migrated"] == 1
    assert "migrated" in capsys.readouterr().out


def test_to_device_after_wrap(survey):
    before = b"import torch\nm = torch.nn.DataParallel(m)\nm.eval()\nm.to('cuda')\n"
    after = (
        b"import torch\nfrom torch.nn.parallel import DistributedDataParallel\n"
        b"m = DistributedDataParallel(m, device_ids=[0])\nm.eval()\nm.to('cuda')\n"
    )
    assert any(f.startswith("to-device-after-wrap") for f in survey.structure_flags(before, after))
    fine = b"import torch\nfrom torch.nn.parallel import DistributedDataParallel\nm.to('cuda')\nm = DistributedDataParallel(m)\n"
    assert survey.structure_flags(before, fine) == []


def test_projects_attribute_library_modules_to_their_entry_migration(survey, tmp_path, capsys):
    """--projects: a library module is counted with the project migration of the entry
    script that plans it (migrated with it, or refused with the entry's line); one no entry
    reaches keeps its own status. Scripts that train nowhere are DDP115, each for its reason;
    one that trains through a project object's method is not."""
    import shutil

    shutil.copytree(ROOT / "fixtures" / "project" / "survey_repos", tmp_path / "repos")
    out_json = tmp_path / "survey.json"
    assert survey.main([str(tmp_path / "repos"), "--projects", "--no-check-inputs", "--json", str(out_json)]) == 0
    report = json.loads(out_json.read_text())
    rows = {Path(r["path"]).relative_to(tmp_path / "repos" / "demo").as_posix(): r for r in report["rows"]}
    assert set(rows) == {"models/__init__.py", "backbone.py", "tools/orphan.py", "predict.py", "fit_by_method.py", "zoo.py"}

    models = rows["models/__init__.py"]
    assert models["status"] == "migrated" and models["per_file_status"] == "refused"
    assert models["project"] == "train.py" and models["compiles"] and models["residual_dp"] == 0
    backbone = rows["backbone.py"]
    assert backbone["status"] == "refused" and backbone["per_file_status"] == "refused"
    assert backbone["project"] == "finetune.py" and backbone["project_at"] == ["finetune.py:16"]
    assert [r.split(":")[0] for r in backbone["reasons"]] == ["DDP105"]
    orphan = rows["tools/orphan.py"]
    assert orphan["status"] == "refused" and orphan["project"] is None and orphan["reasons"][0].startswith("DDP116")

    assert rows["predict.py"]["reasons"][0].startswith("DDP115: no training step in this file")
    assert rows["zoo.py"]["reasons"][0].startswith("DDP115: the <q> block of the module that defines TinyNet")
    assert "never called, only saved" in rows["zoo.py"]["reasons"][0]
    assert rows["fit_by_method.py"]["status"] == "migrated"  # trains in solver.py, through `step = solver.fit_epoch`

    s = report["summary"]
    assert s["per_file_status"]["refused"] == 5 and s["status"]["refused"] == 4 and s["status"]["migrated"] == 2
    assert s["project_attributions"] == {"refused -> migrated": 1, "refused -> refused": 1}
    projects = {Path(p["entry"]).name: p for p in s["projects"]}
    assert set(projects) == {"train.py", "finetune.py"}  # entries whose project modules use DataParallel
    assert projects["train.py"]["status"] == "migrated" and projects["finetune.py"]["status"] == "refused"
    text = capsys.readouterr().out
    assert "refused -> migrated 1" in text and "[project of train.py; alone: refused]" in text
