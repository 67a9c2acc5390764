"""DDP001: `DataParallel` is used. Its fix is the whole DataParallel -> DDP migration."""

from __future__ import annotations

from dp2ddp.findings import Fix
from dp2ddp.model.names import DP, DP_FUNCTIONAL
from dp2ddp.model.wraps import key_only_wraps, type_position
from dp2ddp.rules.base import Hit, Invalid, Rule, Valid, tails

MIGRATION = "ddp001:migration"  # model.cache key: the migration DDP001's fix planned


def plan_migration(model, bridge, options=None):
    """The migration that is DDP001's fix, planned on ``model`` with the LibCST tree of
    ``bridge`` (``.findings``: what it says, DDP1xx; ``.blocked``; ``.edits``): the one
    place `check` reaches the migration (`rewrite` calls the same ``plan``)."""
    from dp2ddp import migrate

    return migrate.plan(model, bridge, options or migrate.Options())


def migration_edits(migration) -> list:
    return [] if migration.blocked else list(migration.edits)


def _fix(m) -> Fix:
    def build(bridge):
        migration = plan_migration(bridge.model, bridge)
        bridge.model.cache[MIGRATION] = migration
        return migration_edits(migration)

    return Fix(build=build, description="migrate DataParallel to DistributedDataParallel")


def check(m):
    # a wrapper made only to load `module.` keys is no DataParallel training (key_only_wraps)
    key_only = {id(c.func) for c in key_only_wraps(m)}
    refs = [r for r in m.refs(DP | DP_FUNCTIONAL) if not type_position(m, r) and id(r) not in key_only]
    if refs:
        fix = _fix(m)  # one fix, shared by every finding of the file
        for ref in refs:
            yield Hit(ref, fix=fix)


RULE = Rule(
    code="DDP001",
    name="data-parallel-usage",
    message="`DataParallel` is used; migrate to `DistributedDataParallel`",
    what=(
        "Checks for uses of `torch.nn.DataParallel` (under any import spelling or alias: "
        "`nn.DataParallel`, `torch.nn.parallel.DataParallel`, `from torch.nn import DataParallel as DP`) and of its "
        "functional form `torch.nn.parallel.data_parallel`. Type checks (`isinstance(m, nn.DataParallel)`, "
        "`type(m) is DP`), which code needs to unwrap either wrapper, are not reported."
    ),
    why=(
        "DataParallel runs one Python process that scatters every batch to the GPUs and gathers the outputs "
        "back on GPU 0 each step: it is bound by the GIL, overloads GPU 0, and does not scale beyond one "
        "machine. PyTorch recommends DistributedDataParallel even on a single machine."
    ),
    fix=(
        "Run the script under `torchrun` with one process per GPU and wrap the model in "
        "`DistributedDataParallel`. `dp2ddp check --fix` (or `dp2ddp rewrite`) performs the whole migration: "
        "process-group set-up and teardown, per-rank device, `DistributedSampler`, rank-0-only saving and logging. "
        "What the migration leaves for a human, or why it refuses a file, is reported with a `DDP1xx` code."
    ),
    fix_safety=(
        "Changes how the script runs (one process per GPU under torchrun; still runs as plain `python`). "
        "Where the migration cannot guarantee that the script does what it did, it leaves the file unchanged "
        "and says why (`DDP101`, `DDP104`, `DDP112`)."
    ),
    fixable=True,
    gate=(tails(DP, DP_FUNCTIONAL),),
    check=check,
    examples=(
        Invalid("import torch.nn as nn\n\nmodel = nn.DataParallel(model)\n", 3, 9, end=(3, 24)),
        Invalid("from torch.nn import DataParallel as DP\n\nnet = DP(net, device_ids=[0, 1])\n", 3, 7, end=(3, 9)),
        Invalid("import torch\n\nmodel = torch.nn.parallel.DataParallel(model).cuda()\n", 3, 9, end=(3, 39)),
        Invalid("import torch.nn as nn\n\nout = nn.parallel.data_parallel(model, batch, [0, 1])\n", 3, 7, end=(3, 32)),
        Valid(
            "import os\n\nimport torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
            "local_rank = int(os.environ[\"LOCAL_RANK\"])\nmodel = DDP(model.to(local_rank), device_ids=[local_rank])\n"
        ),
        Valid("def DP(x):\n    return x\n\nmodel = DP(model)\n"),
        Valid("import torch.nn as nn\n\nnet = model.module if isinstance(model, nn.DataParallel) else model\n"),
    ),
)
