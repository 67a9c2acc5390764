"""Test harness only: ``python -m dp2ddp ARGS`` as a script a zygote can fork (tests/_zygote.py,
:func:`run_verify`): ``sys.path[0]`` the working folder and ``sys.argv[0]`` the module's file,
as ``-m`` gives them."""

import os
import runpy
import sys

sys.path[0] = os.getcwd()
runpy.run_module("dp2ddp", run_name="__main__", alter_sys=True)
