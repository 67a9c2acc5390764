"""Known DDP failure messages -> what to do about them."""

from __future__ import annotations

import re
from typing import List, Tuple

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
