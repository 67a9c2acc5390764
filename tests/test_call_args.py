"""Calls of library functions are read by the callee's signature (dp2ddp/model/call_args.py):
a parameter passed by keyword is read as the same parameter passed by position."""

from __future__ import annotations

import ast
import textwrap

from dp2ddp.model.call_args import SAVE_PARAMS, argument
from dp2ddp.model.core import build


def _model(text: str, path: str = "train.py"):
    return build(textwrap.dedent(text), path)


def _call(m, name: str) -> ast.Call:
    return next(c for c in m.nodes(ast.Call) if m.source(c.func) == name)


def test_argument_by_position_by_keyword_and_behind_a_star():
    call = ast.parse("torch.save(obj, f=path)").body[0].value  # type: ignore[attr-defined]
    assert ast.unparse(argument(call, SAVE_PARAMS, "obj")) == "obj"
    assert ast.unparse(argument(call, SAVE_PARAMS, "f")) == "path"
    assert argument(call, SAVE_PARAMS, "pickle_module") is None
    starred = ast.parse("torch.save(*xs)").body[0].value  # type: ignore[attr-defined]
    assert argument(starred, SAVE_PARAMS, "obj") is None  # the source does not tell


def test_torch_save_by_keyword_saves_the_same_object_to_the_same_file():
    from dp2ddp.model.checkpoint_keys import saved_file_names
    from dp2ddp.model.checkpoints import saved_object

    m = _model("""
        import torch
        model = torch.nn.Linear(2, 2)
        torch.save(obj=model.state_dict(), f="ckpt.pth")
    """)
    call = _call(m, "torch.save")
    assert m.source(saved_object(call)) == "model.state_dict()"
    assert saved_file_names(m) == {"ckpt.pth"}


def test_a_whole_wrapper_saved_by_keyword_is_found_by_ddp016():
    from dp2ddp.rules.ddp016_whole_wrapper_saved import RULE

    src = textwrap.dedent("""
        import torch
        import torch.nn as nn
        model = nn.DataParallel(nn.Linear(2, 2))
        torch.save(obj=model, f="whole.pth")
    """)
    m = build(src, "train.py")
    assert [f.line for f in RULE.run(m)] == [5]


def test_load_state_dict_by_keyword_and_a_positional_strict_are_read():
    """``model.load_state_dict(state_dict=torch.load(...))`` is a load site, and
    ``load_state_dict(state, False)`` (``strict`` by position) takes either keys."""
    from dp2ddp.model.checkpoint_keys import EITHER, PLAIN, load_sites

    m = _model("""
        import torch
        import torch.nn as nn
        model = nn.Linear(2, 2)
        model.load_state_dict(state_dict=torch.load("model_best.pth"))
    """, "eval.py")
    (site,) = load_sites(m, "eval.py")
    assert site.wants == PLAIN and site.files == {"model_best.pth"}
    m = _model("""
        import torch
        import torch.nn as nn
        def load(model):
            model.load_state_dict(torch.load("model_best.pth"), False)
    """, "eval.py")
    (site,) = load_sites(m, "eval.py")
    assert site.wants == EITHER


def test_writers_read_their_path_by_keyword():
    """``shutil.copyfile(src=..., dst=...)`` copies to ``dst``; a SummaryWriter reached as an
    attribute (``__import__(...).SummaryWriter``) writes under ``log_dir=``."""
    from dp2ddp.model.writers import writers

    m = _model("""
        import shutil
        import torch
        torch.save(obj={}, f="last.pth")
        shutil.copyfile(src="last.pth", dst="best.pth")
        tb = __import__("torch.utils.tensorboard", fromlist=["SummaryWriter"]).SummaryWriter(log_dir="runs")
    """)
    got = {w.kind: ast.literal_eval(w.path) for w in writers(m) if w.path is not None}
    assert got == {"save": "last.pth", "copy": "best.pth", "tensorboard": "runs"}


def test_spawn_and_data_loader_by_keyword():
    from dp2ddp.model.launch import spawn_argument, spawns
    from dp2ddp.model.loaders import loaders

    m = _model("""
        import torch
        import torch.multiprocessing as mp
        from torch.utils.data import DataLoader

        def worker(rank, cfg, world):
            loader = DataLoader(dataset=cfg.data, batch_size=cfg.batch)

        mp.spawn(fn=worker, args=(cfg, 2), nprocs=2)
    """)
    (sp,) = spawns(m)
    assert sp.target is m.module_functions["worker"]
    assert m.source(spawn_argument(m, sp, "cfg")) == "cfg" and m.source(spawn_argument(m, sp, "world")) == "2"
    (ld,) = loaders(m)
    assert m.source(ld.dataset) == "cfg.data" and m.source(ld.batch_size) == "cfg.batch"


def test_data_parallel_by_keyword():
    from dp2ddp.model.wraps import dp_wraps

    m = _model("""
        import torch.nn as nn
        net = nn.DataParallel(module=nn.Linear(2, 2), device_ids=[0, 1])
    """)
    (w,) = dp_wraps(m)
    assert m.source(w.module) == "nn.Linear(2, 2)" and m.source(w.args["device_ids"]) == "[0, 1]" and w.problem is None
