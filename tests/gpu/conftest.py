"""tests/gpu: what only a CUDA machine can show (marker ``gpu``).

Skipped where ``torch.cuda.is_available()`` is false, so ``make test`` stays green on CPU.
``DP2DDP_GPU_TESTS_ON_CPU=1`` runs them on the CPU instead (gloo instead of NCCL, no CUDA
checks): a check of the harness itself before a GPU is at hand.
"""
import os

import pytest

ON_CPU = bool(os.environ.get("DP2DDP_GPU_TESTS_ON_CPU"))


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    run = ON_CPU or _cuda()
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not run:
                item.add_marker(pytest.mark.skip(reason="no CUDA device (tests/gpu runs with `pytest -m gpu` on a GPU)"))
