"""Known DDP failure messages -> what to do about them."""

from __future__ import annotations

import re
from typing import List, Tuple

from dp2ddp.model.checkpoint_keys import LIKE_ORIGINAL

# advice that only makes sense for a distributed run (several ranks)
_DISTRIBUTED_ONLY: List[Tuple[str, str]] = [
    (
        r"FileNotFoundError|No such file or directory",
        "If only one rank writes this file (rank 0 saving a checkpoint, a vocabulary, a "
        "downloaded dataset), the other ranks can look for it before it exists: have rank 0 "
        "write it, then call dist.barrier() on every rank before any of them reads it.",
    ),
]

_ADVICE: List[Tuple[str, str]] = [
    (
        r"Expected to have finished reduction in the prior iteration|find_unused_parameters|"
        r"did not receive grad for rank",
        "Some parameters took no part in the loss, so DDP waited for their gradients: pass "
        "find_unused_parameters=True to DistributedDataParallel(...), or make every parameter "
        "contribute to the loss (or freeze it with requires_grad_(False)).",
    ),
    (
        r"Duplicate GPU detected",
        "Two ranks use the same GPU: call torch.cuda.set_device(local_rank) before "
        "init_process_group, pass device_ids=[local_rank], and use no more processes per node "
        "(--nproc) than GPUs.",
    ),
    (
        r"sampler option is mutually exclusive with shuffle",
        "A DataLoader got both sampler= and shuffle=True: drop shuffle=True (pass shuffle to "
        "DistributedSampler instead) and call loader.sampler.set_epoch(epoch) every epoch.",
    ),
    (
        r"out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate memory",
        "Out of memory: each DDP process holds a full replica of the model, optimizer state and "
        "its own batch. Divide the DataLoader batch_size by the world size (global batch = "
        "world size x per-process batch), or lower it, or use fewer processes per device.",
    ),
    (
        r"Detected mismatch between collectives|mismatch between collectives|"
        r"op\.preamble\.length|Mismatch in sequence number|size mismatch|"
        r"Tensors must have same number of dimensions",
        "The ranks called different collectives (or with different shapes or order), usually a "
        "collective inside `if rank == 0:` or a data-dependent number of steps per rank. Rerun "
        "with TORCH_DISTRIBUTED_DEBUG=DETAIL in the environment so gloo/NCCL name the collective.",
    ),
    (
        r"Default process group has not been initialized|init_process_group",
        "The process group is not set up where it is used: call dist.init_process_group(...) "
        "before DistributedSampler, DistributedDataParallel or any dist.* call.",
    ),
    (
        r"Connection closed by peer|Connection reset by peer|NCCL communicator was aborted|"
        r"ProcessGroupNCCL.*Watchdog|heartbeat",
        "This rank lost its peers: another rank failed or exited first. Look at the rank that "
        "failed first; it is the cause.",
    ),
]


def advise(text: str, distributed: bool = True) -> List[str]:
    out: List[str] = []
    for pattern, advice in _ADVICE + (_DISTRIBUTED_ONLY if distributed else []):
        if re.search(pattern, text) and advice not in out:
            out.append(advice)
    return out


def module_prefix(d: dict, keys_of: str, dp_in_original: bool, readers=()) -> Tuple[str, str, str]:
    """(severity, message, advice) for checkpoint keys that differ by a prefix such as
    ``module.`` (``d``: the difference, with both sides' keys). The one place that decides
    what such a difference means: the policy of rewrite's issue 18 (keys as the project's
    own loading code accepts them; where no loader is found, the original's keys) is to be
    pointed at from here: ``readers`` are the project's own loaders of the script's checkpoints
    (:func:`dp2ddp.model.checkpoint_keys.checkpoint_readers`, the ones ``rewrite`` chose the keys
    by). When every one of them loads the migration's keys (or accepts either), the difference
    is a warning naming them; a loader that wants the original's keys makes it a problem; with
    none found, the advice names both sides' keys, which model each loads into, and how to make
    them one."""
    p, how, count = d["prefix"], d["how"], d["count"]

    def few(keys) -> str:
        return ", ".join(map(str, keys[:3])) + (", ..." if count > 3 else "")

    wrapped = f"a wrapped model (`DataParallel(model)`, `DistributedDataParallel(model)`)"
    bare = "the bare model (`model`, or `ddp_model.module`)"
    fits_o, fits_m = (bare, wrapped) if how == "gained" else (wrapped, bare)
    message = (
        f"{{path}}: {keys_of} {how} the `{p}` prefix: the original saves {few(d['original_keys'])} "
        f"(they load into {fits_o}), the migration {few(d['migrated_keys'])} (they load into {fits_m}); "
        f"{count} keys; neither loads into the other's model with a strict `load_state_dict`"
    )
    advice = (
        "make both save the keys the project's own loading code expects (the original's today): "
        "`model.module.state_dict()` gives the bare keys, the wrapper's `model.state_dict()` the `module.` ones; "
        "or make the loading code accept both (strip or add `module.`)"
    )
    if readers and p == "module.":
        mine = "module." if how == "gained" else "plain"
        theirs = "plain" if mine == "module." else "module."
        # a loader that wraps under a test of its own, as the original did, takes the original's keys
        wanting = [r for r in readers if r.wants in (theirs, LIKE_ORIGINAL)]
        if not wanting:
            names = ", ".join(f"{r.path}:{r.line}" for r in readers[:3])
            return ("warning", message + f"; the project's own loader{'s' if len(readers) > 1 else ''} ({names}) "
                    f"load{'' if len(readers) > 1 else 's'} the migration's keys", "nothing to do for this project's code; other code that loads "
                    "these files into " + fits_o + " needs the other keys")
        w = wanting[0]
        return ("problem", message + f"; {w.path}:{w.line}, the project's own loader, wants the original's keys", advice)
    if how == "gained" and p == "module." and not dp_in_original:
        return ("warning", message + "; the original ran without DataParallel here, so its keys have none",
                "nothing to do where the original's wrap runs (on GPUs: DataParallel adds the same `module.`, so "
                "the formats agree there), and a migration by dp2ddp loads either form (DDP170); code of your own "
                "that loads these files into " + fits_o + " needs the other keys")
    return "problem", message, advice
