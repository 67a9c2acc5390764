"""`dp2ddp rewrite` as a user runs it: files, folders, stdin, errors, exit codes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from dp2ddp.cli import main

ROOT = Path(__file__).resolve().parent.parent
DP_SCRIPT = (ROOT / "fixtures/wrap_ddp/wrap_then_to_device.in.py").read_text()
BLOCKED = (ROOT / "fixtures/wrap_ddp/noop_dim_1.in.py").read_text()


@pytest.fixture
def script(tmp_path: Path) -> Path:
    p = tmp_path / "train.py"
    p.write_text(DP_SCRIPT)
    return p


def test_default_writes_stem_ddp_beside_input_and_prints_launch(script: Path, capsys) -> None:
    assert main(["rewrite", str(script)]) == 0
    out = script.with_name("train_ddp.py")
    assert out.exists() and "DistributedDataParallel(" in out.read_text()
    assert script.read_text() == DP_SCRIPT  # input untouched
    printed = capsys.readouterr().out
    assert f"torchrun --standalone --nproc_per_node=2 {out}" in printed
    assert "dp2ddp template" in printed


LOG_OPTION_SCRIPT = """import argparse
import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--log", default="train.log")
parser.add_argument("--local_rank", type=int, default=0)
args = parser.parse_args()
model = nn.DataParallel(nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = model(torch.randn(8, 4)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_launch_lines_end_torchrun_s_options_where_the_script_has_one_it_would_take(tmp_path: Path, capsys) -> None:
    """A script option that begins like two of torchrun's own (``--log``: ``--log-dir``,
    ``--logs-specs``) stops ``torchrun train_ddp.py --log x`` with "ambiguous option": the
    printed launch lines put ``--`` before the script and say why; ``--local_rank`` (one
    match only) does not need it, and scripts without such an option get the plain lines."""
    src = tmp_path / "train.py"
    src.write_text(LOG_OPTION_SCRIPT)
    out = tmp_path / "train_ddp.py"
    assert main(["rewrite", str(src)]) in (0, 1)
    text = capsys.readouterr().out
    assert f"torchrun --standalone --nproc_per_node=2 -- {out}" in text
    (note,) = [ln for ln in text.splitlines() if "ends torchrun's options" in ln]
    assert "the script's --log for an abbreviation" in note and "--local_rank" not in note
    assert main(["rewrite", str(src), "--format", "json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)[0]["launch"]["gpu"] == f"torchrun --standalone --nproc_per_node=gpu -- {out}"
    src.write_text(LOG_OPTION_SCRIPT.replace('"--log"', '"--log_file"'))
    assert main(["rewrite", str(src)]) in (0, 1)
    text = capsys.readouterr().out
    assert f"torchrun --standalone --nproc_per_node=2 {out}" in text and "ends torchrun's options" not in text


def test_output_option_and_stdout(script: Path, tmp_path: Path, capsysbinary) -> None:
    dest = tmp_path / "elsewhere.py"
    assert main(["rewrite", str(script), "-o", str(dest)]) == 0
    assert "DistributedDataParallel(" in dest.read_text()
    capsysbinary.readouterr()
    assert main(["rewrite", str(script), "-o", "-"]) == 0
    assert capsysbinary.readouterr().out == dest.read_bytes()


def test_in_place_keeps_file_mode(script: Path) -> None:
    os.chmod(script, 0o755)
    assert main(["rewrite", "--in-place", str(script)]) == 0
    assert "DistributedDataParallel(" in script.read_text()
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o755
    assert not list(script.parent.glob(".*.tmp"))


def test_diff_writes_nothing(script: Path, capsys) -> None:
    assert main(["rewrite", "--diff", str(script)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"--- a/{script}") and "+model = DistributedDataParallel(model" in out
    assert sorted(p.name for p in script.parent.iterdir()) == ["train.py"]


def test_directory_recurses_and_skips_own_outputs(tmp_path: Path, capsys) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(DP_SCRIPT)
    (tmp_path / "pkg" / "plain.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "old_ddp.py").write_text(DP_SCRIPT)
    assert main(["rewrite", str(tmp_path / "pkg")]) == 0
    names = sorted(p.name for p in (tmp_path / "pkg").iterdir())
    assert names == ["a.py", "a_ddp.py", "old_ddp.py", "plain.py"]
    assert "plain.py: no DataParallel found" in capsys.readouterr().out


def test_explicit_ddp_named_file_is_not_skipped_beside_a_folder(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "skipped_ddp.py").write_text(DP_SCRIPT)
    named = tmp_path / "legacy_ddp.py"  # a DP script that merely has this name
    named.write_text(DP_SCRIPT)
    assert main(["rewrite", str(tmp_path / "pkg"), str(named)]) == 0
    assert (tmp_path / "legacy_ddp_ddp.py").exists()
    assert not (tmp_path / "pkg" / "skipped_ddp_ddp.py").exists()


def test_launch_lines_find_the_modules_beside_the_original(tmp_path: Path, capsys) -> None:
    """Written to another folder, a script that imports a module beside its original is
    launched with that folder on PYTHONPATH (Python looks beside the script it runs);
    written beside it, the lines are plain."""
    src = tmp_path / "proj" / "train.py"
    src.parent.mkdir()
    (src.parent / "helpers.py").write_text("def f():\n    return 1\n")
    src.write_text("import helpers\n" + DP_SCRIPT)
    out = tmp_path / "elsewhere" / "train_ddp.py"
    out.parent.mkdir()
    assert main(["rewrite", str(src), "-o", str(out)]) in (0, 1)
    text = capsys.readouterr().out
    assert f"PYTHONPATH={src.parent} torchrun --standalone --nproc_per_node=2 {out}" in text, text
    assert main(["rewrite", str(src), "-o", str(out), "--format", "json"]) in (0, 1)
    launch = json.loads(capsys.readouterr().out)[0]["launch"]
    assert launch["cpu"] == f"PYTHONPATH={src.parent} torchrun --standalone --nproc_per_node=2 {out}"
    # the module really is found so (the original's folder on the path, not the output's)
    r = subprocess.run([sys.executable, "-c", "import helpers"], cwd=str(out.parent), env={**os.environ, "PYTHONPATH": str(src.parent)})
    assert r.returncode == 0
    assert main(["rewrite", str(src)]) in (0, 1)
    text = capsys.readouterr().out
    assert "PYTHONPATH" not in text and f"torchrun --standalone --nproc_per_node=2 {src.parent / 'train_ddp.py'}" in text


def test_config_exclude_is_honoured(tmp_path: Path, capsys) -> None:
    """`[tool.dp2ddp] exclude` leaves the same files out of `rewrite` as out of `check`: in a
    folder walk, and named explicitly (as pre-commit passes them), with a line saying so."""
    (tmp_path / "pyproject.toml").write_text('[tool.dp2ddp]\nexclude = ["legacy", "gen_*.py"]\n')
    (tmp_path / "legacy").mkdir()
    for rel in ("train.py", "legacy/old.py", "gen_model.py"):
        (tmp_path / rel).write_text(DP_SCRIPT)
    assert main(["rewrite", str(tmp_path)]) == 0
    assert (tmp_path / "train_ddp.py").exists()
    assert not (tmp_path / "legacy" / "old_ddp.py").exists() and not (tmp_path / "gen_model_ddp.py").exists()
    capsys.readouterr()
    assert main(["rewrite", str(tmp_path / "legacy" / "old.py")]) == 0
    assert not (tmp_path / "legacy" / "old_ddp.py").exists()
    assert "old.py: excluded by [tool.dp2ddp] exclude in" in capsys.readouterr().err
    # the same files `check` leaves out
    from dp2ddp.check.config import load_config
    from dp2ddp.source import iter_python_files

    cfg = load_config(str(tmp_path / "pyproject.toml"))
    checked = {Path(p).name for p in iter_python_files([str(tmp_path)], cfg.exclude, cfg.root)}
    assert checked == {"train.py", "train_ddp.py"}
    # a configuration that cannot be read: one line, exit 2, nothing written
    (tmp_path / "pyproject.toml").write_text('[tool.dp2ddp]\nexclude = 3\n')
    assert main(["rewrite", str(tmp_path / "train.py"), "-o", str(tmp_path / "x.py")]) == 2
    assert "exclude must be a list of strings" in capsys.readouterr().err
    assert not (tmp_path / "x.py").exists()


def test_stdin_to_stdout() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "dp2ddp", "rewrite", "-"], input=DP_SCRIPT.encode(), capture_output=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    assert b"DistributedDataParallel(model" in r.stdout
    compile(r.stdout, "<stdout>", "exec")


def test_blocked_file_exit_1_warning_format_nothing_written(tmp_path: Path, capsys) -> None:
    p = tmp_path / "rnn.py"
    p.write_text(BLOCKED)
    assert main(["rewrite", str(p)]) == 1
    err = capsys.readouterr().err
    assert f"{p}:4:7: DDP101 DataParallel(dim=1)" in err
    assert not (tmp_path / "rnn_ddp.py").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"import torch\nmodel = torch.nn.DataParallel(\n", ":2: syntax error: '(' was never closed"),
        (b"import torch\n# caf\xe9\nm = torch.nn.DataParallel(x)\n", ":2: cannot decode byte 0xe9 as utf-8"),
    ],
    ids=["syntax_error", "undecodable_bytes"],
)
def test_bad_input_one_line_error_and_nothing_written(tmp_path: Path, capsys, content: bytes, message: str) -> None:
    good = tmp_path / "good.py"
    good.write_text(DP_SCRIPT)
    bad = tmp_path / "bad.py"
    bad.write_bytes(content)
    assert main(["rewrite", str(good), str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"error: {bad}") and message in err[0]
    assert "Traceback" not in "\n".join(err)
    assert not (tmp_path / "good_ddp.py").exists(), "nothing may be written when an input is bad"


def test_missing_file_and_usage_errors(tmp_path: Path, capsys) -> None:
    assert main(["rewrite", str(tmp_path / "nope.py")]) == 2
    assert f"{tmp_path / 'nope.py'}: no such file" in capsys.readouterr().err
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text(DP_SCRIPT)
    b.write_text(DP_SCRIPT)
    assert main(["rewrite", str(a), str(b), "-o", str(tmp_path / "x.py")]) == 2
    assert main(["rewrite", str(a), "--in-place", "--diff"]) == 2
    assert main(["rewrite"]) == 2


def test_json_summary(script: Path, capsys) -> None:
    assert main(["rewrite", "--format", "json", str(script)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data[0]["migrated"] is True and data[0]["output"].endswith("train_ddp.py")
    codes = {c["code"] for c in data[0]["changes"]}
    assert {"DDP100", "DDP120"} <= codes
    assert data[0]["launch"]["cpu"].startswith("torchrun --standalone --nproc_per_node=2")


def test_failed_write_leaves_no_partial_file(script: Path, monkeypatch) -> None:
    import dp2ddp.source as source

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(source.os, "replace", boom)
    with pytest.raises(OSError):
        main(["rewrite", "--in-place", str(script)])
    assert script.read_text() == DP_SCRIPT
    assert sorted(p.name for p in script.parent.iterdir()) == ["train.py"]


def test_rewrite_and_help_never_import_torch(script: Path) -> None:
    code = (
        "import sys; from dp2ddp.cli import main; "
        f"rc = main(['rewrite', '-q', {str(script)!r}]); "
        "assert rc == 0, rc; "
        "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]; "
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_version_and_help(capsys) -> None:
    assert main(["--version"]) == 0
    assert "dp2ddp" in capsys.readouterr().out
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("rewrite", "check", "verify", "template"):
        assert cmd in out


def test_accept_writes_a_refused_migration_with_a_comment_at_the_spot(tmp_path: Path, capsys) -> None:
    """``--accept DDP105`` takes the named risk: the refusal becomes a warning (exit 1), the
    migration is written, and the statement carries a comment saying so; an unknown code is
    a usage error."""
    src = (ROOT / "fixtures" / "shard_loaders" / "noop_iterable_dataset_unbatched_refused.in.py").read_bytes()
    f = tmp_path / "train.py"
    f.write_bytes(src)
    assert main(["rewrite", str(f)]) == 1
    assert not (tmp_path / "train_ddp.py").exists()
    assert "DDP105" in capsys.readouterr().err
    assert main(["rewrite", "--accept", "ddp105", str(f)]) == 1
    out = (tmp_path / "train_ddp.py").read_text()
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("train_loader = "))
    assert lines[i - 1].startswith("# dp2ddp: accepted DDP105")
    assert "DistributedDataParallel(" in out
    assert "(accepted: written anyway)" in capsys.readouterr().err
    assert main(["rewrite", "--accept", "DDP999", str(f)]) == 2


def test_output_to_a_folder_writes_the_input_name_inside_it(script: Path, tmp_path: Path) -> None:
    """`-o out/` names a folder (made if missing); `-o` of a folder that exists too."""
    assert main(["rewrite", "-q", str(script), "-o", str(tmp_path / "out") + "/"]) == 0
    assert "DistributedDataParallel" in (tmp_path / "out" / "train.py").read_text()
    (tmp_path / "there").mkdir()
    assert main(["rewrite", "-q", str(script), "-o", str(tmp_path / "there")]) == 0
    assert (tmp_path / "there" / "train.py").is_file()


def test_output_under_a_file_is_a_one_line_error(script: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "afile").write_text("x")
    rc = main(["rewrite", "-q", str(script), "-o", str(tmp_path / "afile" / "x.py")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cannot write" in err and "not a folder" in err, err
    assert (tmp_path / "afile").read_text() == "x"


# ---------------------------------------------------------------- --accept and the own check
CTC_OR_ATTN = ROOT / "fixtures" / "valid_mean" / "noop_ctc_or_attention_loss_under_one_name_refused.in.py"


def test_an_accepted_refusal_is_not_refused_again_by_the_own_check_of_the_same_hazard() -> None:
    """DeepLabV3Plus: `--accept DDP176,DDP185` wrote nothing until DDP186 was accepted too, as
    check's DDP018 reported the very loss the user had accepted. A rule's ``accepted_by``
    names the refusals of its hazard: accepted at a statement, its finding there is no miss;
    the same finding at a statement the user did not accept still refuses."""
    from dp2ddp.migrate import Options, migrate_bytes, own_check

    data = CTC_OR_ATTN.read_bytes()
    assert migrate_bytes(data, "train.py").migration.blocked
    res = migrate_bytes(data, "train.py", Options(accept=frozenset({"DDP176"})))
    assert not res.migration.blocked and res.changed, [(f.code, f.message) for f in res.migration.findings]
    assert all(f.code != "DDP186" for f in res.migration.findings)
    lines = sorted(f.line for f in res.migration.findings if f.code == "DDP176")
    assert lines == [21, 23]
    assert own_check(res.output, "train.py", data, accepted={("DDP176", 21), ("DDP176", 23)}) is None
    missed = own_check(res.output, "train.py", data, accepted={("DDP176", 21)})
    assert missed is not None and missed.code == "DDP186" and missed.line == 23 and "DDP018" in missed.message
