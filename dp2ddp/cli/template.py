"""`dp2ddp template`: launch files for the migrated script on torchrun, SLURM or Kubernetes.

The files are rendered from Jinja templates in ``dp2ddp/templates/launch/``, in the
environment of :mod:`dp2ddp.cli.launch_quoting`: nothing the user passes reaches the
output unquoted. This module checks what the user passes (:func:`build_spec`) and writes
the files.

Never imports torch.
"""

from __future__ import annotations

from dp2ddp.model.names import may_use_dp

import os
import re
import shlex
import stat
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import click

from dp2ddp.cli.launch_quoting import environment

KINDS = ("torchrun", "slurm", "k8s")
DEFAULT_PORT = 29500

_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,128}$")
_SLURM_PARTITION = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")
_SLURM_ACCOUNT = re.compile(r"^[A-Za-z0-9_.-]+$")
_SLURM_TIME = re.compile(r"^(\d+-\d+(:\d+){0,2}|\d+(:\d+){0,2})$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOST = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")


class TemplateInputError(click.ClickException):
    """A one-line user error: exit code 2."""

    exit_code = 2


# --------------------------------------------------------------------------- the spec


@dataclass
class LaunchSpec:
    kind: str
    script: str
    script_args: List[str]
    nodes: int = 1
    nproc_per_node: int = 1
    port: int = DEFAULT_PORT
    cpu: bool = False
    job_name: str = "train"
    max_restarts: Optional[int] = None
    rdzv_host: Optional[str] = None  # torchrun multi-node, c10d
    master_addr: Optional[str] = None  # torchrun multi-node, static rendezvous
    env: List[Tuple[str, str]] = field(default_factory=list)
    # slurm
    partition: Optional[str] = None
    time: Optional[str] = None
    account: Optional[str] = None
    cpus_per_task: Optional[int] = None
    # k8s
    image: Optional[str] = None
    namespace: Optional[str] = None

    @property
    def fresh_store_per_restart(self) -> bool:
        """torchrun (2.5 and later) shares its rendezvous TCPStore with the workers and
        keeps it across restarts; the restarted workers then read the previous attempt's
        process-group keys and fail to connect (pytorch/pytorch#135712, #167288). Setting
        TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in torchrun's environment gives each attempt
        a fresh store hosted by the rank-0 worker."""
        return bool(self.max_restarts)

    def context(self) -> Dict[str, object]:
        return dict(self.__dict__, launch_args=self.launch_args(), fresh_store_per_restart=self.fresh_store_per_restart)

    def launch_args(self) -> List[str]:
        """``--``, the script and its arguments. ``--`` ends torchrun's own options: without
        it, torchrun reads a script option that begins like one of its own (``--log`` is a
        prefix of ``--log-dir`` and ``--logs-specs``; ``--r=16`` of ``--redirects``) as its own
        and stops with "ambiguous option" (pytorch/pytorch#120601), even after the script."""
        return ["--", self.script, *self.script_args]


def render(spec: LaunchSpec) -> str:
    name = {"torchrun": "torchrun.sh.j2", "slurm": "slurm.sbatch.j2", "k8s": "pytorchjob.yaml.j2"}[spec.kind]
    return environment().get_template(name).render(**spec.context())


def default_job_name(script: str, kind: str) -> str:
    stem = os.path.splitext(os.path.basename(script.rstrip("/")))[0] or "train"
    if kind == "k8s":
        name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")
        if not name or not name[0].isalpha():
            name = "job-" + name
        return name[:63].rstrip("-") or "train"
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "-", stem).strip("-")
    return name[:128] or "train"


def _fail(message: str) -> TemplateInputError:
    return TemplateInputError(message)


def _check_text(label: str, value: str) -> None:
    if "\x00" in value:
        raise _fail(f"{label}: contains a NUL character, which no shell or manifest can carry")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(f"{label}: is not valid UTF-8") from None


def _split_endpoint(endpoint: str, port: Optional[int]) -> Tuple[str, int]:
    host, sep, port_text = endpoint.rpartition(":")
    if not sep or host.count(":") and not host.startswith("["):  # no port (or a bare IPv6 address)
        host, port_text = endpoint, ""
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise _fail(f"--rdzv-endpoint {endpoint!r}: port must be a number from 1 to 65535")
        if port is not None and int(port_text) != port:
            raise _fail(f"--rdzv-endpoint {endpoint!r} and --port {port} name different ports")
        return host, int(port_text)
    return host, port if port is not None else DEFAULT_PORT


def build_spec(
    kind: str,
    script: str,
    script_args: Sequence[str],
    *,
    nodes: int = 1,
    gpus_per_node: int = 1,
    port: Optional[int] = None,
    image: Optional[str] = None,
    cpu: bool = False,
    job_name: Optional[str] = None,
    rdzv_endpoint: Optional[str] = None,
    master_addr: Optional[str] = None,
    max_restarts: Optional[int] = None,
    env: Sequence[str] = (),
    partition: Optional[str] = None,
    time: Optional[str] = None,
    account: Optional[str] = None,
    cpus_per_task: Optional[int] = None,
    namespace: Optional[str] = None,
) -> LaunchSpec:
    """Validate the user's choices; raise :class:`TemplateInputError` (one line) on any
    value that cannot be rendered safely or makes no sense for ``kind``."""
    _check_text("SCRIPT", script)
    for i, a in enumerate(script_args, 1):
        _check_text(f"script argument {i}", a)
    if not script.strip():
        raise _fail("SCRIPT: empty script path")
    if script.startswith("-"):
        raise _fail(f"SCRIPT {script!r}: a script path cannot start with '-' (write ./{script})")

    only = {
        "--image": ("k8s", image),
        "--namespace": ("k8s", namespace),
        "--partition": ("slurm", partition),
        "--time": ("slurm", time),
        "--account": ("slurm", account),
        "--cpus-per-task": ("slurm", cpus_per_task),
        "--rdzv-endpoint": ("torchrun", rdzv_endpoint),
        "--master-addr": ("torchrun", master_addr),
    }
    for opt, (for_kind, value) in only.items():
        if value is not None and kind != for_kind:
            raise _fail(f"{opt} applies to `dp2ddp template {for_kind}` only")

    spec = LaunchSpec(kind=kind, script=script, script_args=list(script_args), nodes=nodes,
                      nproc_per_node=gpus_per_node, cpu=cpu, max_restarts=max_restarts)
    spec.port = port if port is not None else DEFAULT_PORT

    if kind == "torchrun":
        if rdzv_endpoint is not None and master_addr is not None:
            raise _fail("--rdzv-endpoint (c10d rendezvous) and --master-addr (static rendezvous) exclude each other")
        if nodes == 1 and (rdzv_endpoint or master_addr):
            raise _fail("--rdzv-endpoint/--master-addr need --nodes > 1 (one node uses --standalone)")
        if rdzv_endpoint is not None:
            _check_text("--rdzv-endpoint", rdzv_endpoint)
            host, spec.port = _split_endpoint(rdzv_endpoint, port)
            if not _HOST.match(host):
                raise _fail(f"--rdzv-endpoint {rdzv_endpoint!r}: not a host name or address")
            spec.rdzv_host = host
        if master_addr is not None:
            if max_restarts:
                raise _fail("--max-restarts needs c10d rendezvous (--rdzv-endpoint): torchrun cannot restart workers under static rendezvous (--master-addr)")
            _check_text("--master-addr", master_addr)
            if not _HOST.match(master_addr):
                raise _fail(f"--master-addr {master_addr!r}: not a host name or address")
            spec.master_addr = master_addr

    if job_name is not None:
        _check_text("--job-name", job_name)
        if kind == "k8s" and not _DNS1035.match(job_name):
            raise _fail(f"--job-name {job_name!r}: a PyTorchJob name must be lower-case letters, digits and '-', start with a letter, at most 63 characters")
        if kind != "k8s" and not _SLURM_NAME.match(job_name):
            raise _fail(f"--job-name {job_name!r}: use letters, digits and _.+- only")
        spec.job_name = job_name
    else:
        spec.job_name = default_job_name(script, kind)
    if kind == "k8s":
        # The operator names pods and services <job>-master-0, <job>-worker-<i>: DNS labels of 63 at most.
        longest = f"{spec.job_name}-worker-{nodes - 2}" if nodes > 1 else f"{spec.job_name}-master-0"
        if len(longest) > 63:
            if job_name is not None:
                raise _fail(f"--job-name {job_name!r}: too long, pod name {longest!r} would exceed 63 characters")
            spec.job_name = spec.job_name[: len(spec.job_name) - (len(longest) - 63)].rstrip("-")

    for item in env:
        _check_text("--env", item)
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.match(name):
            raise _fail(f"--env {item!r}: expected NAME=VALUE with NAME made of letters, digits and _")
        spec.env.append((name, value))

    if kind == "slurm":
        for opt, value, pattern in (("--partition", partition, _SLURM_PARTITION), ("--account", account, _SLURM_ACCOUNT), ("--time", time, _SLURM_TIME)):
            if value is not None:
                _check_text(opt, value)
                if not pattern.match(value):
                    raise _fail(f"{opt} {value!r}: not a valid SLURM value")
        spec.partition, spec.account, spec.time, spec.cpus_per_task = partition, account, time, cpus_per_task

    if kind == "k8s":
        if image is None:
            raise _fail("k8s needs --image IMAGE: the container image that holds the script and torch")
        _check_text("--image", image)
        if not _IMAGE.match(image):
            raise _fail(f"--image {image!r}: not a container image reference")
        if namespace is not None:
            _check_text("--namespace", namespace)
            if not _DNS1123_LABEL.match(namespace):
                raise _fail(f"--namespace {namespace!r}: not a valid Kubernetes namespace")
        spec.image, spec.namespace = image, namespace
    return spec


# --------------------------------------------------------------------------- output


def _write(path: str, text: str, executable: bool) -> None:
    from dp2ddp.source import atomic_write

    existed = os.path.exists(path)
    try:
        atomic_write(path, text.encode("utf-8"))
        if existed:
            mode = stat.S_IMODE(os.stat(path).st_mode)
        else:  # atomic_write's temporary file is 0600: give it the usual umask-based mode
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        if executable:
            mode |= (mode & 0o444) >> 2  # x wherever r
        os.chmod(path, mode)
    except OSError as e:
        raise _fail(f"{path}: cannot write: {e.strerror or e}") from None


def _dp_warning(script: str) -> Optional[str]:
    """Warn when SCRIPT looks like the DataParallel original rather than the migration."""
    try:
        with open(script, "rb") as fh:
            data = fh.read(1_000_000)
    except OSError:
        return None
    if may_use_dp(data) and b"init_process_group" not in data:
        stem, ext = os.path.splitext(script)
        return f"warning: {script} still uses DataParallel; run `dp2ddp rewrite {shlex.quote(script)}` and launch {stem}_ddp{ext or '.py'} instead"
    return None


_EPILOG = """\b
Examples:
  dp2ddp template torchrun train_ddp.py --gpus-per-node 8
  dp2ddp template torchrun train_ddp.py --nodes 2 --gpus-per-node 8 --rdzv-endpoint node0:29500
  dp2ddp template slurm train_ddp.py --nodes 4 --gpus-per-node 8 --partition gpu -o train.sbatch
  dp2ddp template k8s train_ddp.py --nodes 2 --image registry/me/train:1 -o job.yaml -- --epochs 10
"""


@click.command(
    "template",
    epilog=_EPILOG,
    context_settings={"help_option_names": ["-h", "--help"]},
    short_help="Render launch files for torchrun, SLURM or Kubernetes.",
)
@click.argument("kind", type=click.Choice(KINDS))
@click.argument("script")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS...]")
@click.option("--nodes", "-N", type=click.IntRange(min=1), default=1, show_default=True, help="Number of machines.")
@click.option("--gpus-per-node", "--nproc-per-node", "gpus_per_node", type=click.IntRange(min=1), default=1, show_default=True,
              help="Processes per machine: one per GPU (with --cpu: CPU processes).")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help=f"Rendezvous port [default: {DEFAULT_PORT}].")
@click.option("--image", default=None, help="k8s: container image holding the script and torch (required for k8s).")
@click.option("--cpu", is_flag=True, help="CPU nodes (gloo backend): request no GPUs.")
@click.option("--job-name", default=None, help="Job name and rendezvous id [default: from SCRIPT].")
@click.option("--rdzv-endpoint", default=None, metavar="HOST[:PORT]",
              help="torchrun, several nodes: c10d rendezvous on HOST (one of the nodes); same command on every node.")
@click.option("--master-addr", default=None, metavar="HOST",
              help="torchrun, several nodes: static rendezvous on HOST; each node sets NODE_RANK.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=None,
              help="Restart the worker group up to N times after a failure (script must checkpoint and resume).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Environment variable for the job (repeatable).")
@click.option("--partition", default=None, help="slurm: partition.")
@click.option("--time", "time_limit", default=None, help="slurm: time limit, e.g. 4:00:00 or 1-00:00:00.")
@click.option("--account", default=None, help="slurm: account to charge.")
@click.option("--cpus-per-task", type=click.IntRange(min=1), default=None, help="slurm: CPUs for each node's torchrun agent and its workers.")
@click.option("--namespace", default=None, help="k8s: namespace of the PyTorchJob.")
@click.option("-o", "--output", default="-", metavar="FILE", help="Write to FILE ('-' for stdout, the default).")
def template(kind, script, script_args, nodes, gpus_per_node, port, image, cpu, job_name, rdzv_endpoint,
             master_addr, max_restarts, env, partition, time_limit, account, cpus_per_task, namespace, output) -> int:
    """Render a launch file for SCRIPT (the migrated *_ddp.py) on KIND: torchrun, slurm or k8s.

    torchrun: a bash script with the torchrun command (--standalone on one node;
    --nnodes with c10d or static rendezvous on several). slurm: an sbatch script that
    starts one torchrun agent per node. k8s: a Kubeflow PyTorchJob manifest.
    Arguments after `--` are passed to SCRIPT.
    """
    spec = build_spec(
        kind, script, script_args, nodes=nodes, gpus_per_node=gpus_per_node, port=port, image=image, cpu=cpu,
        job_name=job_name, rdzv_endpoint=rdzv_endpoint, master_addr=master_addr, max_restarts=max_restarts,
        env=env, partition=partition, time=time_limit, account=account, cpus_per_task=cpus_per_task,
        namespace=namespace,
    )
    text = render(spec)
    warning = _dp_warning(script)
    if warning:
        click.echo(warning, err=True)
    if output == "-":
        click.echo(text, nl=False)
        return 0
    _check_text("-o", output)
    _write(output, text, executable=kind in ("torchrun", "slurm"))
    how = {"torchrun": f"run it with: bash {shlex.quote(output)}" + (" (on every node)" if nodes > 1 else ""),
           "slurm": f"submit it with: sbatch {shlex.quote(output)}",
           "k8s": f"submit it with: kubectl apply -f {shlex.quote(output)}"}[kind]
    click.echo(f"wrote {output}; {how}", err=True)
    return 0
