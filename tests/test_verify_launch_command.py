"""The torchrun command ``dp2ddp verify`` launches the migration with: the script's own
options reach the script, whatever they are called."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dp2ddp.verify import runner

# ``--log`` begins like torchrun's --log-dir/--logs-specs, ``--r`` like --rdzv-*/--redirects/--role,
# ``--local`` like --local-addr/--local-ranks-filter: torchrun, reading them as abbreviations of
# its own options, stops with "ambiguous option" unless ``--`` ends its options (pytorch/pytorch#120601)
SCRIPT_ARGS = ["--log", "run.txt", "--r=16", "--local", "x", "--", "tail"]


def _spec(tmp_path: Path, nnodes: int = 1) -> runner.RunSpec:
    return runner.RunSpec(role="migrated", script=tmp_path / "argv.py", args=list(SCRIPT_ARGS), cwd=tmp_path,
                          out=tmp_path, tag="t", steps=1, timeout=60, nproc=1, nnodes=nnodes)


@pytest.mark.parametrize("nnodes", [1, 2])
def test_torchrun_options_end_before_the_script(tmp_path, nnodes):
    for cmd in runner._commands(_spec(tmp_path, nnodes)):
        at = cmd.index(str(tmp_path / "argv.py"))
        assert cmd[at - 1] == "--" and cmd[at + 1:] == SCRIPT_ARGS
        assert cmd.index("--") == at - 1  # the first "--" is torchrun's end of options


def test_the_original_runs_as_python_runs_it(tmp_path):
    spec = _spec(tmp_path)
    spec.role = "original"
    assert runner._commands(spec) == [[sys.executable, str(tmp_path / "argv.py"), *SCRIPT_ARGS]]


@pytest.mark.torchrun
def test_a_script_option_that_begins_like_torchrun_s_own_reaches_the_script(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "argv.py").write_text("import json, sys\nprint('ARGV ' + json.dumps(sys.argv[1:]))\n")
    (cmd,) = runner._commands(_spec(tmp_path))
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    (line,) = [ln for ln in res.stdout.splitlines() if ln.startswith("ARGV ")]
    assert json.loads(line[5:]) == SCRIPT_ARGS


def test_the_torchrun_option_list_is_the_installed_torch_s():
    pytest.importorskip("torch")
    from torch.distributed.run import get_args_parser

    from dp2ddp.cli.torchrun_options import TORCHRUN_LONG_OPTIONS

    installed = sorted(o for a in get_args_parser()._actions for o in a.option_strings if o.startswith("--"))
    assert sorted(TORCHRUN_LONG_OPTIONS) == installed


@pytest.mark.parametrize("option, stops", [("--log", True), ("--log=x", True), ("--local", True), ("--r", True),
                                           ("--local_rank", False), ("--log_dir", False), ("--lr", False),
                                           ("--resume", False), ("-r", False)])
def test_which_script_options_torchrun_stops_on(option, stops):
    from dp2ddp.cli.torchrun_options import ambiguous

    assert ambiguous(option) is stops
