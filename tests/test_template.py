"""`dp2ddp template`: torchrun / SLURM / Kubernetes launch files.

The rendered files are checked by what they *do*, not by how they look: bash scripts run
for real against recording stand-ins for `torchrun`, `srun` and `scontrol` (so the argv
that torchrun would receive is compared exactly), and the torchrun forms are also run
with real torchrun agents on CPU (gloo) — single node, and two agents on loopback with
c10d and with static rendezvous. The manifest is parsed with PyYAML and Kubernetes'
``$(VAR)`` expansion is applied to it before comparing arguments.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from dp2ddp.cli import main
from tests._scripts import guarded, retry_exit_abort, run, run_together

# Strings that would run something, end a line, or break quoting if pasted unquoted.
NASTY = [
    '"; rm -rf / #',
    "$(touch PWNED)",
    "`touch PWNED`",
    "${HOME}",
    "$(MASTER_ADDR)",
    "a'b\"c",
    "line1\nline2; touch PWNED",
    "back\\slash",
    "tab\there",
    "--not-a-torchrun-flag",
    "*",
    "",
    "héllo ☃ 🎉",
    "# not a comment",
    "key: value",
    "- item",
    "{yaml: flow}",
    "&anchor *alias !tag",
]

TIMEOUT = 150


# --------------------------------------------------------------------------- helpers


def render(capsys, *argv: str) -> str:
    rc = main(["template", *argv])
    out = capsys.readouterr().out
    assert rc == 0, out
    return out


def fail(capsys, *argv: str) -> str:
    """Run a command that must be refused: exit 2 and an error on stderr, nothing on stdout."""
    rc = main(["template", *argv])
    captured = capsys.readouterr()
    assert rc == 2, captured
    assert captured.out == ""
    return captured.err


def one_line_error(capsys, *argv: str) -> str:
    err = fail(capsys, *argv)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert "Traceback" not in err
    return lines[0]


def free_port() -> int:
    """A free port *outside* the kernel's ephemeral range: a port from that range can be
    taken as the source port of some outgoing connection (gloo opens many) between this
    check and the agent's bind, and then both agents would end up as rendezvous clients."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            low, high = map(int, fh.read().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    candidates = range(20000, low) if low > 21000 else range(high + 1, 65535)
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(200):
        port = rng.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found")


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "GROUP_RANK")
           and not k.startswith(("PET_", "TORCHELASTIC_", "SLURM_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(extra)
    return guarded(env)


def make_bin(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(body)
    path.chmod(0o755)


def recorder_bin(folder: Path) -> Path:
    """A `torchrun` that appends its argv (as JSON) to $RECORD instead of running anything."""
    make_bin(folder, "torchrun",
             f"#!{sys.executable}\nimport json, os, sys\n"
             "with open(os.environ['RECORD'], 'a') as fh:\n"
             "    fh.write(json.dumps(sys.argv[1:]) + '\\n')\n")
    return folder


def torchrun_bin(folder: Path) -> Path:
    """A `torchrun` that is this interpreter's torch.distributed.run."""
    make_bin(folder, "torchrun", f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m torch.distributed.run \"$@\"\n")
    return folder


def with_path(env: Dict[str, str], *folders: Path) -> Dict[str, str]:
    return dict(env, PATH=os.pathsep.join([*map(str, folders), env.get("PATH", "")]))


def run_bash(script: Path, cwd: Path, env: Dict[str, str]) -> subprocess.CompletedProcess:
    return run(["bash", str(script)], cwd, timeout=TIMEOUT, env=env)


def recorded(record: Path) -> List[List[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()]


def bash_syntax_ok(text: str, tmp_path: Path) -> None:
    path = tmp_path / "syntax-check.sh"
    path.write_text(text)
    check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def k8s_expand(value: str, env: Dict[str, str]) -> str:
    """Kubernetes' expansion of container command/args/env: $(VAR) -> value of VAR when
    defined, $$ -> $, anything else unchanged."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("$(", i) and ")" in value[i:]:
            end = value.index(")", i)
            name = value[i + 2:end]
            out.append(env.get(name, value[i:end + 1]))
            i = end + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


# A tiny DDP job: each rank records what it saw, including its argv.
TINY_DDP = r'''
import json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(3, 1))
model(torch.full((4, 3), float(rank + 1))).sum().backward()
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as fh:
    json.dump({"rank": rank, "world": world, "local_rank": int(os.environ["LOCAL_RANK"]),
               "node_rank": int(os.environ["GROUP_RANK"]), "sum": total.item(),
               "grad": model.module.weight.grad.tolist(), "argv": sys.argv[1:]}, fh)
dist.destroy_process_group()
'''


def check_ranks(out_dir: Path, world: int, nodes: int, argv: List[str]) -> None:
    reports = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(world)]
    assert [r["rank"] for r in reports] == list(range(world))
    assert {r["world"] for r in reports} == {world}
    assert {r["sum"] for r in reports} == {world * (world + 1) / 2}
    assert all(r["grad"] == reports[0]["grad"] for r in reports), "DDP did not average the gradients"
    assert sorted({r["node_rank"] for r in reports}) == list(range(nodes))
    assert all(r["argv"] == argv for r in reports)


# --------------------------------------------------------------------------- torchrun: argv


def test_torchrun_single_node_command(capsys, tmp_path):
    text = render(capsys, "torchrun", "train_ddp.py", "--gpus-per-node", "4", "--", "--epochs", "3")
    bash_syntax_ok(text, tmp_path)
    record = tmp_path / "argv.jsonl"
    script = tmp_path / "launch.sh"
    script.write_text(text)
    res = run_bash(script, tmp_path, with_path(clean_env(RECORD=str(record)), recorder_bin(tmp_path / "bin")))
    assert res.returncode == 0, res.stdout
    assert recorded(record) == [["--standalone", "--nproc_per_node=4", "--", "train_ddp.py", "--epochs", "3"]]


def test_torchrun_multi_node_c10d_command(capsys, tmp_path):
    text = render(capsys, "torchrun", "train_ddp.py", "--nodes", "3", "--gpus-per-node", "8",
                  "--rdzv-endpoint", "node0.cluster:29400", "--job-name", "exp1", "--max-restarts", "2")
    bash_syntax_ok(text, tmp_path)
    script = tmp_path / "launch.sh"
    script.write_text(text)
    record = tmp_path / "argv.jsonl"
    res = run_bash(script, tmp_path, with_path(clean_env(RECORD=str(record)), recorder_bin(tmp_path / "bin")))
    assert res.returncode == 0, res.stdout
    assert recorded(record) == [["--nnodes=3", "--nproc_per_node=8", "--rdzv_backend=c10d",
                                 "--rdzv_endpoint=node0.cluster:29400", "--rdzv_id=exp1", "--max_restarts=2",
                                 "--", "train_ddp.py"]]
    # restarts need a fresh store per attempt (see dp2ddp.cli.template.LaunchSpec.fresh_store_per_restart)
    assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text


def test_torchrun_multi_node_endpoint_from_environment(capsys, tmp_path):
    text = render(capsys, "torchrun", "train_ddp.py", "--nodes", "2", "--port", "1234")
    script = tmp_path / "launch.sh"
    script.write_text(text)
    record = tmp_path / "argv.jsonl"
    env = with_path(clean_env(RECORD=str(record)), recorder_bin(tmp_path / "bin"))
    # Without MASTER_ADDR the script stops with a message and starts nothing.
    res = run_bash(script, tmp_path, env)
    assert res.returncode != 0 and "MASTER_ADDR" in res.stdout
    assert not record.exists()
    res = run_bash(script, tmp_path, dict(env, MASTER_ADDR="10.1.2.3"))
    assert res.returncode == 0, res.stdout
    assert recorded(record) == [["--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                                 "--rdzv_endpoint=10.1.2.3:1234", "--rdzv_id=train_ddp", "--", "train_ddp.py"]]


def test_torchrun_multi_node_static_command(capsys, tmp_path):
    text = render(capsys, "torchrun", "train_ddp.py", "--nodes", "2", "--gpus-per-node", "2",
                  "--master-addr", "10.0.0.5", "--port", "23456")
    script = tmp_path / "launch.sh"
    script.write_text(text)
    record = tmp_path / "argv.jsonl"
    env = with_path(clean_env(RECORD=str(record)), recorder_bin(tmp_path / "bin"))
    res = run_bash(script, tmp_path, env)
    assert res.returncode != 0 and "NODE_RANK" in res.stdout
    res = run_bash(script, tmp_path, dict(env, NODE_RANK="1"))
    assert res.returncode == 0, res.stdout
    assert recorded(record) == [["--nnodes=2", "--nproc_per_node=2", "--node_rank=1", "--master_addr=10.0.0.5",
                                 "--master_port=23456", "--", "train_ddp.py"]]


# --------------------------------------------------------------------------- injection


@pytest.mark.parametrize("kind", ["torchrun", "slurm"])
def test_shell_arguments_round_trip_inert(capsys, tmp_path, kind):
    script_path = "dir with space/it's $(x).py"
    env_value = "$(touch PWNED); `touch PWNED`\n'\""
    text = render(capsys, kind, script_path, "--nodes", "2", "--env", f"DP2DDP_PROBE={env_value}", "--", *NASTY)
    bash_syntax_ok(text, tmp_path)
    # shlex sees exactly one word per argument on the torchrun command line
    command = text[text.index("torchrun \\"):]
    words = shlex.split(command.replace("\\\n", " "), comments=False)
    assert words[-len(NASTY) - 1:] == [script_path, *NASTY]

    bin_dir = recorder_bin(tmp_path / "bin")
    # torchrun stand-in also records the probe variable, to check --env values arrive intact
    make_bin(bin_dir, "torchrun",
             f"#!{sys.executable}\nimport json, os, sys\n"
             "with open(os.environ['RECORD'], 'a') as fh:\n"
             "    fh.write(json.dumps(sys.argv[1:] + [os.environ['DP2DDP_PROBE']]) + '\\n')\n")
    make_bin(bin_dir, "scontrol", "#!/bin/sh\nprintf 'node-a\\nnode-b\\n'\n")
    make_bin(bin_dir, "srun", "#!/bin/sh\nwhile [ \"${1#--}\" != \"$1\" ]; do shift; done\nexec \"$@\"\n")
    record = tmp_path / "argv.jsonl"
    script = tmp_path / "launch.sh"
    script.write_text(text)
    env = with_path(clean_env(RECORD=str(record), MASTER_ADDR="h", SLURM_JOB_NODELIST="node-[a-b]",
                              SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID="7"), bin_dir)
    res = run_bash(script, tmp_path, env)
    assert res.returncode == 0, res.stdout
    (argv,) = recorded(record)
    assert argv[-len(NASTY) - 2:] == [script_path, *NASTY, env_value]
    assert not list(tmp_path.rglob("PWNED")), "an argument was executed by the shell"


def test_yaml_arguments_round_trip_inert(capsys):
    yaml = pytest.importorskip("yaml")
    env_value = "$(HOME) $$ \n: - # {x}"
    text = render(capsys, "k8s", "train ddp.py", "--nodes", "2", "--image", "reg.io/team/img:1",
                  "--env", f"PROBE={env_value}", "--", *NASTY)
    doc = yaml.safe_load(text)
    pod_env = {"MASTER_ADDR": "job-master-0", "MASTER_PORT": "29500", "RANK": "1", "HOME": "/root"}
    for replica in ("Master", "Worker"):
        (container,) = doc["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"]
        args = [k8s_expand(a, pod_env) for a in container["args"]]
        assert args[-len(NASTY) - 1:] == ["train ddp.py", *NASTY]
        env = {e["name"]: k8s_expand(e["value"], pod_env) for e in container["env"]}
        assert env["PROBE"] == env_value
        # the launcher's own $(VAR) references are expanded by Kubernetes
        assert "--master_addr=job-master-0" in args and "--node_rank=1" in args


def test_values_that_cannot_be_quoted_are_refused(capsys):
    # #SBATCH lines are comments to bash: a newline would start a command, so such values
    # are validated, not quoted.
    for argv in (["slurm", "t.py", "--partition", "gpu\nrm -rf /"],
                 ["slurm", "t.py", "--job-name", "a b"],
                 ["slurm", "t.py", "--time", "$(id)"],
                 ["slurm", "t.py", "--account", "x;y"],
                 ["torchrun", "t.py", "--job-name", "x\ny"],
                 ["k8s", "t.py", "--image", "img", "--job-name", "Bad_Name"],
                 ["k8s", "t.py", "--image", "img", "--namespace", "a/b"],
                 ["k8s", "t.py", "--image", "img", "--nodes", "12", "--job-name", "a" * 55],
                 ["k8s", "t.py", "--image", "img:1\n  evil: true"],
                 ["torchrun", "t.py", "--env", "BAD NAME=1"],
                 ["torchrun", "t.py", "--env", "NOEQUALS"],
                 ["torchrun", "t.py", "--nodes", "2", "--rdzv-endpoint", "h;id:1"],
                 ["torchrun", "t.py", "--nodes", "2", "--master-addr", "$(id)"],
                 ["torchrun", "t.py", "--", "nul\x00byte"]):
        line = one_line_error(capsys, *argv)
        assert "\n" not in line


# --------------------------------------------------------------------------- slurm


def test_slurm_sbatch_script(capsys, tmp_path):
    text = render(capsys, "slurm", "train_ddp.py", "--nodes", "4", "--gpus-per-node", "8", "--port", "29411",
                  "--partition", "gpu", "--time", "1-00:00:00", "--account", "proj1", "--cpus-per-task", "32",
                  "--job-name", "big_run", "--", "--epochs", "90")
    bash_syntax_ok(text, tmp_path)
    assert text.startswith("#!/bin/bash\n")
    directives = dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)$", text, re.M))
    assert directives == {"job-name": "big_run", "nodes": "4", "ntasks-per-node": "1", "gpus-per-node": "8",
                          "cpus-per-task": "32", "partition": "gpu", "account": "proj1", "time": "1-00:00:00",
                          "output": "%x-%j.out"}
    # #SBATCH directives must come before the first command, or sbatch ignores them
    first_command = next(i for i, line in enumerate(text.splitlines()) if line and not line.startswith("#"))
    assert all(i < first_command for i, line in enumerate(text.splitlines()) if line.startswith("#SBATCH"))
    assert 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1' in text

    # Run it as SLURM would on the first node: srun runs the command once per node.
    bin_dir = recorder_bin(tmp_path / "bin")
    make_bin(bin_dir, "scontrol", "#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] || exit 9\n"
                                  "printf 'gpu-017\\ngpu-018\\ngpu-019\\ngpu-020\\n'\n")
    make_bin(bin_dir, "srun", "#!/bin/sh\necho \"srun $*\" >> \"$RECORD.srun\"\n"
                              "while [ \"${1#--}\" != \"$1\" ]; do shift; done\n"
                              "for n in 1 2 3 4; do \"$@\" || exit 1; done\n")
    record = tmp_path / "argv.jsonl"
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = with_path(clean_env(RECORD=str(record), SLURM_JOB_NODELIST="gpu-[017-020]", SLURM_JOB_NUM_NODES="4",
                              SLURM_JOB_ID="123456"), bin_dir)
    res = run_bash(script, tmp_path, env)
    assert res.returncode == 0, res.stdout
    expected = ["--nnodes=4", "--nproc_per_node=8", "--rdzv_backend=c10d", "--rdzv_endpoint=gpu-017:29411",
                "--rdzv_id=123456", "--", "train_ddp.py", "--epochs", "90"]
    assert recorded(record) == [expected] * 4
    assert (tmp_path / "argv.jsonl.srun").read_text().startswith("srun --kill-on-bad-exit=1 --cpus-per-task=32 torchrun ")


def test_slurm_cpu_nodes_request_no_gpus(capsys, tmp_path):
    text = render(capsys, "slurm", "train_ddp.py", "--nodes", "2", "--gpus-per-node", "4", "--cpu")
    bash_syntax_ok(text, tmp_path)
    assert "--gpus-per-node" not in text and "gpu" not in text.lower().replace("one per gpu", "")
    assert "--nproc_per_node=4" in text


def test_slurm_without_head_node_fails_cleanly(capsys, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(render(capsys, "slurm", "train_ddp.py", "--nodes", "2"))
    bin_dir = recorder_bin(tmp_path / "bin")
    make_bin(bin_dir, "scontrol", "#!/bin/sh\nexit 1\n")
    make_bin(bin_dir, "srun", "#!/bin/sh\ntouch \"$RECORD\"\n")
    record = tmp_path / "argv.jsonl"
    res = run_bash(script, tmp_path, with_path(clean_env(RECORD=str(record), SLURM_JOB_NODELIST="x",
                                                         SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID="1"), bin_dir))
    assert res.returncode != 0 and "cannot find the first node" in res.stdout
    assert not record.exists()


# --------------------------------------------------------------------------- k8s


def _containers(doc, replica):
    spec = doc["spec"]["pytorchReplicaSpecs"][replica]
    return spec, spec["template"]["spec"]["containers"]


def test_k8s_pytorchjob_manifest(capsys):
    yaml = pytest.importorskip("yaml")
    text = render(capsys, "k8s", "train_ddp.py", "--nodes", "4", "--gpus-per-node", "8", "--image",
                  "ghcr.io/me/train:2", "--namespace", "ml", "--job-name", "resnet", "--port", "23456",
                  "--", "--epochs", "90")
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "PyTorchJob"
    assert doc["metadata"] == {"name": "resnet", "namespace": "ml"}
    assert doc["spec"]["nprocPerNode"] == "8"  # a string in the v1 API
    assert "elasticPolicy" not in doc["spec"]
    assert set(doc["spec"]["pytorchReplicaSpecs"]) == {"Master", "Worker"}
    for replica, replicas in (("Master", 1), ("Worker", 3)):
        spec, (container,) = _containers(doc, replica)
        assert spec["replicas"] == replicas and spec["restartPolicy"] == "OnFailure"
        assert container["name"] == "pytorch"  # the operator looks for this name
        assert container["image"] == "ghcr.io/me/train:2"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert {"name": "pytorchjob-port", "containerPort": 23456, "protocol": "TCP"} in container["ports"]
        assert container["command"] == ["torchrun"]
        assert container["args"] == ["--nnodes=4", "--nproc_per_node=8", "--node_rank=$(RANK)",
                                     "--master_addr=$(MASTER_ADDR)", "--master_port=$(MASTER_PORT)",
                                     "--", "train_ddp.py", "--epochs", "90"]


def test_k8s_single_node_cpu_elastic(capsys):
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(render(capsys, "k8s", "t.py", "--image", "img", "--cpu", "--gpus-per-node", "4"))
    assert set(doc["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    _, (container,) = _containers(doc, "Master")
    assert "resources" not in container
    assert doc["metadata"]["name"] == "t" and "namespace" not in doc["metadata"]
    # a default name derived from a long script name is shortened so pod names stay DNS labels
    doc = yaml.safe_load(render(capsys, "k8s", "x" * 80 + ".py", "--image", "img", "--nodes", "12"))
    assert len(doc["metadata"]["name"] + "-worker-10") == 63

    doc = yaml.safe_load(render(capsys, "k8s", "train_ddp.py", "--nodes", "3", "--image", "img",
                                "--max-restarts", "2"))
    assert doc["spec"]["elasticPolicy"] == {"rdzvBackend": "c10d", "rdzvHost": "train-ddp-master-0",
                                            "rdzvPort": 29500, "minReplicas": 3, "maxReplicas": 3,
                                            "maxRestarts": 2}
    for replica in ("Master", "Worker"):
        _, (container,) = _containers(doc, replica)
        assert "--rdzv_backend=c10d" in container["args"]
        assert "--rdzv_endpoint=$(MASTER_ADDR):$(MASTER_PORT)" in container["args"]
        assert "--max_restarts=2" in container["args"]
        assert {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"} in container["env"]


# --------------------------------------------------------------------------- CLI behaviour


@pytest.mark.parametrize("argv, message", [
    (["k8s", "t.py"], "--image"),
    (["torchrun", "t.py", "--partition", "gpu"], "--partition applies to `dp2ddp template slurm` only"),
    (["slurm", "t.py", "--image", "x"], "--image applies to `dp2ddp template k8s` only"),
    (["slurm", "t.py", "--rdzv-endpoint", "h"], "--rdzv-endpoint applies"),
    (["torchrun", "t.py", "--rdzv-endpoint", "h:1"], "need --nodes > 1"),
    (["torchrun", "t.py", "--nodes", "2", "--rdzv-endpoint", "h:1", "--master-addr", "h"], "exclude each other"),
    (["torchrun", "t.py", "--nodes", "2", "--rdzv-endpoint", "h:1", "--port", "2"], "different ports"),
    (["torchrun", "t.py", "--nodes", "2", "--rdzv-endpoint", "h:99999"], "port"),
    (["torchrun", "t.py", "--nodes", "2", "--master-addr", "h", "--max-restarts", "1"], "static rendezvous"),
    (["torchrun", "--", "-x.py"], "cannot start with '-'"),
    (["torchrun", ""], "empty"),
])
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    assert message in one_line_error(capsys, *argv)


@pytest.mark.parametrize("argv", [
    ["cron", "t.py"],
    ["torchrun", "t.py", "--nodes", "0"],
    ["torchrun", "t.py", "--port", "70000"],
    ["torchrun", "t.py", "--epochs", "3"],  # script options belong after --
    ["torchrun"],
])
def test_click_usage_errors_exit_2(capsys, argv):
    err = fail(capsys, *argv)
    assert "Error" in err and "Traceback" not in err


def test_output_file_is_written_atomically_with_modes(capsys, tmp_path):
    sbatch = tmp_path / "job.sbatch"
    assert main(["template", "slurm", "t.py", "-o", str(sbatch)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "sbatch" in captured.err
    mode = stat.S_IMODE(sbatch.stat().st_mode)
    assert mode & 0o100 and mode & 0o400, oct(mode)
    assert sbatch.read_text() == render(capsys, "slurm", "t.py", "-o", "-")

    manifest = tmp_path / "job.yaml"
    assert main(["template", "k8s", "t.py", "--image", "i", "-o", str(manifest)]) == 0
    assert not stat.S_IMODE(manifest.stat().st_mode) & 0o111
    assert stat.S_IMODE(manifest.stat().st_mode) & 0o400

    # Rewriting an existing file replaces it whole and keeps its mode; no temp files left.
    manifest.chmod(0o640)
    assert main(["template", "k8s", "t.py", "--image", "j", "-o", str(manifest)]) == 0
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o640
    assert '"j"' in manifest.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.sbatch", "job.yaml"]
    capsys.readouterr()

    err = one_line_error(capsys, "torchrun", "t.py", "-o", str(tmp_path / "missing" / "x.sh"))
    assert "missing/x.sh" in err


def test_warns_when_given_the_dataparallel_original(capsys, tmp_path):
    dp = tmp_path / "train.py"
    dp.write_text("import torch\nmodel = torch.nn.DataParallel(torch.nn.Linear(1, 1))\n")
    assert main(["template", "torchrun", str(dp)]) == 0
    err = capsys.readouterr().err
    assert "still uses DataParallel" in err and "train_ddp.py" in err


def test_template_does_not_import_torch(tmp_path):
    code = ("import sys; from dp2ddp.cli import main; "
            "rc = [main(['template', k, 't.py', '--image', 'i'] if k == 'k8s' else ['template', k, 't.py']) "
            "for k in ('torchrun', 'slurm', 'k8s')]; "
            "assert rc == [0, 0, 0], rc; assert 'torch' not in sys.modules, 'torch imported'")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert res.returncode == 0, res.stderr


def test_every_value_goes_through_a_quoting_filter():
    """The environment refuses a value that reaches the output unfiltered, so a template
    that forgets `| sh` / `| yq` breaks loudly instead of becoming injectable."""
    from dp2ddp.cli.launch_quoting import environment

    env = environment()
    with pytest.raises(ValueError, match="without a quoting filter"):
        env.from_string("echo {{ x }}").render(x="$(id)")
    assert env.from_string("echo {{ x | sh }}").render(x="$(id)") == "echo '$(id)'"
    assert env.from_string("n: {{ x | yq }}").render(x="a\n\"b\"") == 'n: "a\\x0a\\"b\\""'


# --------------------------------------------------------------------------- real torchrun runs


@pytest.mark.torchrun
def test_rendered_single_node_command_trains(capsys, tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "tiny_ddp.py").write_text(TINY_DDP)
    # ``--log``: a prefix of torchrun's --log-dir/--logs-specs, which torchrun would stop on
    # without the ``--`` that ends its options (pytorch/pytorch#120601)
    args = ["--lr", "0.1", "--log", "run.txt", "$(touch PWNED)", "two words"]
    script = tmp_path / "launch.sh"
    assert main(["template", "torchrun", "tiny_ddp.py", "--gpus-per-node", "2", "--cpu", "-o", str(script),
                 "--", *args]) == 0
    capsys.readouterr()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = with_path(clean_env(OUT_DIR=str(out_dir)), torchrun_bin(tmp_path / "bin"))
    res = retry_exit_abort(lambda: run_bash(script, tmp_path, env), "torchrun launch script")
    assert res.returncode == 0, res.stdout[-4000:]
    check_ranks(out_dir, world=2, nodes=1, argv=args)
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.torchrun
@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_rendered_multi_node_command_trains_on_loopback(capsys, tmp_path, rendezvous):
    """Two torchrun agents x one process each, as two 'machines' on 127.0.0.1."""
    pytest.importorskip("torch")
    (tmp_path / "tiny_ddp.py").write_text(TINY_DDP)
    port = free_port()
    how = ["--rdzv-endpoint", f"127.0.0.1:{port}"] if rendezvous == "c10d" else ["--master-addr", "127.0.0.1", "--port", str(port)]
    script = tmp_path / "launch.sh"
    assert main(["template", "torchrun", "tiny_ddp.py", "--nodes", "2", "--cpu", "--job-name", "loop", *how,
                 "-o", str(script), "--", "x y"]) == 0
    capsys.readouterr()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = with_path(clean_env(OUT_DIR=str(out_dir)), torchrun_bin(tmp_path / "bin"))
    results = retry_exit_abort(
        lambda: run_together([["bash", str(script)]] * 2, tmp_path, [dict(env, NODE_RANK=str(n)) for n in range(2)],
                             timeout=TIMEOUT),
        f"two agents ({rendezvous})",
    )
    for res in results:
        assert res.returncode == 0, res.stdout[-4000:]
    check_ranks(out_dir, world=2, nodes=2, argv=["x y"])


@pytest.mark.torchrun
def test_rendered_sbatch_trains_with_two_agents(capsys, tmp_path):
    """The sbatch script end to end, with srun/scontrol stand-ins that start one real
    torchrun agent per 'node' on this machine."""
    pytest.importorskip("torch")
    (tmp_path / "tiny_ddp.py").write_text(TINY_DDP)
    port = free_port()
    script = tmp_path / "job.sbatch"
    assert main(["template", "slurm", "tiny_ddp.py", "--nodes", "2", "--cpu", "--port", str(port), "-o", str(script),
                 "--", "--flag"]) == 0
    capsys.readouterr()
    bin_dir = torchrun_bin(tmp_path / "bin")
    make_bin(bin_dir, "scontrol", "#!/bin/sh\nprintf '127.0.0.1\\nlocalhost\\n'\n")
    # srun: one agent per node, in parallel; fail if any fails.
    make_bin(bin_dir, "srun", "#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\n"
                              "\"$@\" & a=$!; \"$@\" & b=$!; wait $a || exit 1; wait $b || exit 1\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = with_path(clean_env(OUT_DIR=str(out_dir), SLURM_JOB_NODELIST="127.0.0.1,localhost",
                              SLURM_JOB_NUM_NODES="2", SLURM_JOB_ID=str(os.getpid())), bin_dir)
    res = retry_exit_abort(lambda: run_bash(script, tmp_path, env), "sbatch script")
    assert res.returncode == 0, res.stdout[-4000:]
    check_ranks(out_dir, world=2, nodes=2, argv=["--flag"])
