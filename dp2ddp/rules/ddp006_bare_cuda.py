"""DDP006: bare `.cuda()` / `"cuda"` in DDP code that never selects the rank's device."""

from __future__ import annotations

import ast

from dp2ddp.model.collectives import is_ddp_code
from dp2ddp.model.entry_points import has_entry_point
from dp2ddp.model.names import CUDA_DEVICE_SELECT, DDP, INIT
from dp2ddp.model.ranks import mentions_local_rank
from dp2ddp.model.syntax import kwarg
from dp2ddp.rules.base import DDP_CODE, Hit, Invalid, Rule, Valid, attribute_name_position, literal, positional

MESSAGE = "bare `{what}` in DDP code without `torch.cuda.set_device(local_rank)`: every rank uses GPU 0"
_TORCH_CUDA = frozenset({"torch.cuda"})


def _device_literal_site(m, node: ast.Constant) -> bool:
    """Where a device string is given: an argument, an assigned value, a conditional
    expression, a parameter default, a class argument."""
    parent = m.parent(node)
    if isinstance(parent, (ast.Call, ast.keyword, ast.Starred, ast.IfExp, ast.arguments)):
        return True
    if isinstance(parent, (ast.Assign, ast.AnnAssign)):
        return parent.value is node
    if isinstance(parent, ast.ClassDef):
        return any(b is node for b in parent.bases)
    return False


def _tests_for_the_wrapper(m) -> bool:
    """``isinstance(model, (DataParallel, DistributedDataParallel))``."""
    for call in m.calls_spelled("isinstance"):
        for n in ast.walk(call):
            if isinstance(n, (ast.Name, ast.Attribute)) and m.qualified_names(n) & DDP:
                return True
    return False


def check(m):
    if not is_ddp_code(m) or m.calls(CUDA_DEVICE_SELECT) or mentions_local_rank(m):
        return
    if (m.calls(DDP) or m.calls(_IS_INITIALIZED) or _tests_for_the_wrapper(m)) and not m.calls(INIT) and not has_entry_point(m):
        # a project's helper (it wraps a model, asks whether a process group exists, or tests
        # whether it was handed the wrapper): the script that starts the process group picks
        # the device
        return
    for call in m.calls_spelled("cuda"):
        f = call.func
        if isinstance(f, ast.Attribute) and not positional(call) and kwarg(call, "device") is None:
            if not m.is_name(f, _TORCH_CUDA):  # the module torch.cuda is not called
                yield Hit(f, MESSAGE.format(what=".cuda()"), at=attribute_name_position(m, f))
    for s in m.all_nodes(ast.Constant):  # (findings are put in order by the caller)
        v = s.value
        if isinstance(v, str) and v in ("cuda", "cuda:0") and _device_literal_site(m, s):
            yield Hit(s, MESSAGE.format(what=f'"{v}"'))


_IS_INITIALIZED = frozenset({"torch.distributed.is_initialized"})
_DDP = "import torch\nimport torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\n"

RULE = Rule(
    code="DDP006",
    name="cuda-device-without-local-rank",
    message=MESSAGE,
    what=(
        "In DDP code that never calls `torch.cuda.set_device` and never reads the local rank, checks for "
        "`.cuda()` without a device and for the device strings `\"cuda\"` / `\"cuda:0\"`. A library module that "
        "builds the DDP wrapper (no `init_process_group`, nothing that runs when executed: a project's helper) is "
        "left to the script that starts the process group, which picks the device for every module it imports."
    ),
    why=(
        "`.cuda()` and `\"cuda\"` mean the *current* device, which is GPU 0 unless the process selected "
        "another one. Every rank then puts its model and batches on GPU 0: the job runs out of memory on GPU 0 "
        "or NCCL fails with duplicate GPU errors, while the other GPUs stay idle."
    ),
    fix=(
        "Read `local_rank = int(os.environ[\"LOCAL_RANK\"])`, call `torch.cuda.set_device(local_rank)` "
        "before anything touches CUDA, and use `.to(local_rank)` / `f\"cuda:{local_rank}\"`."
    ),
    fix_safety="",
    gate=(DDP_CODE, literal("cuda", "cuda:0")),
    check=check,
    examples=(
        Invalid("import torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\nmodel = model.cuda()\n", 4, 15, end=(4, 19)),
        Invalid(_DDP + "device = torch.device(\"cuda:0\")\n", 5, 23, end=(5, 31)),
        Valid(
            "import os\n\nimport torch\nimport torch.distributed as dist\n\ndist.init_process_group(\"nccl\")\n"
            "torch.cuda.set_device(int(os.environ[\"LOCAL_RANK\"]))\nmodel = model.cuda()\n"
        ),
        Valid(
            "import os\n\nimport torch\nimport torch.distributed as dist\n\nlocal_rank = int(os.environ[\"LOCAL_RANK\"])\n"
            "dist.init_process_group(\"nccl\")\nmodel = model.to(f\"cuda:{local_rank}\")\n"
        ),
        Valid("import torch\n\nmodel = model.cuda()  # not DDP code\n"),
        Valid(  # a helper module: the script that imports it selects the device
            "from torch.nn.parallel import DistributedDataParallel as DDP\n\n\ndef build(net):\n"
            "    return DDP(net.cuda())\n"
        ),
        Valid(  # a helper module that asks for the rank only where a process group exists (a migrated helper)
            "import torch\nimport torch.distributed as dist\n\ndevice = torch.device(\"cuda\")\n\n\ndef report(x):\n"
            "    if (dist.get_rank() if dist.is_initialized() else 0) == 0:\n        print(x)\n"
        ),
        Valid("import torch.distributed as dist\n\nif tensor.device.type == \"cuda\":\n    pass\n"),
        Valid(  # a migrated helper that only tests whether it was handed the wrapper (PointRCNN's loss functions)
            "import torch.nn as nn\nfrom torch.nn.parallel import DistributedDataParallel\n\n\ndef model_fn(model, data):\n"
            "    x = data.cuda(non_blocking=True)\n    if isinstance(model, (nn.DataParallel, DistributedDataParallel)):\n"
            "        model = model.module\n    return model(x)\n"
        ),
    ),
)
