"""Test harness only: give gloo worker threads time to finish before the interpreter
finalizes (torch 2.13 exit race; see tests/_scripts.py). Loaded through PYTHONPATH."""

import atexit
import sys
import time


def _settle() -> None:
    # a run forked from a zygote (tests/_zygote_server.py) ends with os._exit after atexit:
    # it never reaches finalization, where the race is, so it needs no sleep
    if "torch.distributed" in sys.modules and not getattr(sys, "dp2ddp_zygote_fork", False):
        time.sleep(0.2)  # releases the GIL; atexit runs before finalization begins


atexit.register(_settle)
