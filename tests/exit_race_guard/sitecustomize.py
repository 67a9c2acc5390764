"""Test harness only: give gloo worker threads time to finish before the interpreter
finalizes (torch 2.13 exit race; see tests/_scripts.py). Loaded through PYTHONPATH."""

import atexit
import sys
import time


def _settle() -> None:
    if "torch.distributed" in sys.modules:
        time.sleep(0.2)  # releases the GIL; atexit runs before finalization begins


atexit.register(_settle)
