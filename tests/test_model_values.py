"""Value facts of dp2ddp/model that decide sharding: names a project's star imports bind,
objects that hold and iterate a DataLoader, loops whose passes update the parameters, and
generators of loader batches (unit tests; the fixtures and behaviour tests run them)."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

from dp2ddp.model.core import build
from dp2ddp.model.project_defs import project_def
from dp2ddp.model.held_loaders import held_loader
from dp2ddp.model.loaders import loaders
from dp2ddp.model.training import training_loops, updates
from dp2ddp.model.training_feeds import trained_origins

ROOT = Path(__file__).resolve().parent.parent


def _write(folder: Path, files: dict) -> Path:
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return folder / "train.py"


def _call(m, name: str) -> ast.Call:
    return next(c for c in m.nodes(ast.Call) if m.source(c.func) == name)


def test_a_star_import_of_a_project_package_binds_what_its_modules_import_and_define(tmp_path):
    """``from models import *`` where ``models/__init__.py`` star-imports ``.small`` (which
    imports torch and defines SmallCNN): ``torch.nn.DataParallel`` is torch's, ``SmallCNN``
    is ``models.small.SmallCNN`` and its definition is found; a module's own ``__all__``
    still limits what it exports."""
    script = _write(tmp_path, {
        "models/__init__.py": "from .small import *\n",
        "models/small.py": "import torch\nimport torch.nn as nn\nclass SmallCNN(nn.Module):\n    pass\ndef _private():\n    pass\n",
        "utils.py": "import torch\n__all__ = ['Batches']\nclass Batches:\n    pass\nclass Hidden:\n    pass\n",
        "train.py": "from models import *\nfrom utils import *\nmodel = torch.nn.DataParallel(SmallCNN())\nb = Batches()\nh = Hidden()\n_private()\n",
    })
    m = build(script.read_text(), str(script))
    dp = _call(m, "torch.nn.DataParallel")
    assert m.qualified_names(dp.func) == {"torch.nn.DataParallel"}
    assert m.qualified_names(_call(m, "SmallCNN").func) == {"models.small.SmallCNN"}
    found = project_def(m, _call(m, "SmallCNN").func)
    assert found is not None and found[1].name == "SmallCNN"
    assert m.qualified_names(_call(m, "Batches").func) == {"utils.Batches"}
    assert not m.qualified_names(_call(m, "Hidden").func)  # not in utils.__all__
    assert not m.qualified_names(_call(m, "_private").func)  # private names are not star-exported


def test_a_star_import_cycle_ends(tmp_path):
    script = _write(tmp_path, {
        "a.py": "from b import *\nimport torch\n",
        "b.py": "from a import *\ndef f():\n    pass\n",
        "train.py": "from a import *\nf()\n",
    })
    m = build(script.read_text(), str(script))
    assert m.qualified_names(_call(m, "f").func) == {"b.f"}


HELD = """
import torch
from torch.utils.data import DataLoader

class Batches:
    def __init__(self, ds, bs, shuffle):
        self.dataloader = DataLoader(ds, batch_size=bs, shuffle=shuffle)
    def __iter__(self):
        return ({{"x": x}} for x, in self.dataloader)
{extra}

train_batches = Batches(ds, 4, shuffle=True)
"""


def test_an_object_that_holds_and_iterates_one_loader_is_found():
    m = build(HELD.format(extra=""))
    held = held_loader(m, _call(m, "Batches"))
    assert held is not None and held.attribute == "dataloader" and held.cls.name == "Batches" and held.where == ""
    (ld,) = loaders(m)
    assert ld.held and not ld.training  # decided per object, not at the class's DataLoader


def test_a_loader_attribute_set_again_elsewhere_is_not_held():
    """``reset()`` replaces the loader: a shard_loader of the first one would be lost."""
    m = build(HELD.format(extra="    def reset(self, ds):\n        self.dataloader = DataLoader(ds, batch_size=2)\n"))
    assert held_loader(m, _call(m, "Batches")) is None


def test_a_class_iterating_two_attributes_is_not_held():
    extra = "    def more(self):\n        pass\n"
    src = HELD.format(extra=extra).replace("for x, in self.dataloader)", "for x, in zip(self.dataloader, self.other))")
    m = build(src)
    assert held_loader(m, _call(m, "Batches")) is None


def test_a_loop_that_only_takes_input_gradients_does_not_update():
    """An adversarial evaluation loop reaches ``.backward()`` through the attack but never an
    optimizer step: its data stays whole. Accumulating over a whole loop and stepping after
    it updates; so does a hand-written SGD over ``parameters()``."""
    m = build(textwrap.dedent("""
        def attack(model, x):
            x.requires_grad_(True)
            model(x).sum().backward()
            return x.grad

        def evaluate(model, loader):
            for x in loader:
                attack(model, x)

        def accumulate(model, loader, opt):
            for x in loader:
                model(x).sum().backward()
            opt.step()

        def sgd(model, loader):
            for x in loader:
                model(x).sum().backward()
                for p in model.parameters():
                    p.data.add_(p.grad, alpha=-0.1)
    """))
    by_function = {m.enclosing_function(lp).name: lp for lp in training_loops(m)}
    assert set(by_function) == {"evaluate", "accumulate", "sgd"}
    assert not updates(m, by_function["evaluate"])
    assert updates(m, by_function["accumulate"]) and updates(m, by_function["sgd"])


def test_a_generator_of_loader_batches_feeds_training_through_its_yields():
    m = build(textwrap.dedent("""
        from torch.utils.data import DataLoader

        def sample(ds):
            loader = iter(DataLoader(ds, batch_size=4))
            while True:
                try:
                    yield next(loader)
                except StopIteration:
                    loader = iter(DataLoader(ds, batch_size=4))
                    yield next(loader)

        def train(model, opt, ds):
            data = sample(ds)
            for _ in range(10):
                x = next(data)
                model(x).sum().backward()
                opt.step()
    """))
    made = {id(c) for c in m.nodes(ast.Call) if m.source(c.func) == "DataLoader"}
    assert len(made) == 2 and made <= {i for i, _ in trained_origins(m)}
    assert all(ld.training for ld in loaders(m))


def test_a_load_into_a_wrapper_moved_to_the_device_in_the_same_expression_wants_prefixed_keys(tmp_path):
    """``model_test = nn.DataParallel(model_test).cuda()`` then ``model_test.load_state_dict(...)``
    (Bag-of-Tricks-for-AT's eval script): a load into a wrapper, so the migration keeps the
    ``module.`` keys the original wrote (its plain keys crashed that script's own resume)."""
    from dp2ddp.model.checkpoint_keys import PREFIXED, load_sites

    script = _write(tmp_path, {"eval.py": """
        import torch
        import torch.nn as nn
        model_test = nn.Linear(2, 2).cuda()
        model_test = nn.DataParallel(model_test).cuda()
        model_test.load_state_dict(torch.load("model_best.pth"))
    """, "train.py": ""})
    pm = build((tmp_path / "eval.py").read_text(), str(tmp_path / "eval.py"))
    (site,) = load_sites(pm, "eval.py")
    assert site.wants == PREFIXED and script.exists()


def test_a_class_a_package_re_exports_is_found_and_a_results_logger_is_a_writer(tmp_path):
    """``from utils import Logger`` where ``utils/__init__.py`` does ``from .logger import *``:
    the definition is found in utils/logger.py, and a plain class that opens its file for
    writing is a writer; a Dataset subclass that writes a cache is not."""
    from dp2ddp.model.writing_classes import writing_class

    script = _write(tmp_path, {
        "utils/__init__.py": "from .logger import *\n",
        "utils/logger.py": "class Logger(object):\n    def __init__(self, path):\n        self.f = open(path, 'w')\n",
        "data.py": "import torch\nclass Cached(torch.utils.data.Dataset):\n    def __init__(self, p):\n        torch.save([1], p)\n",
        "train.py": "from utils import Logger\nfrom data import Cached\nlog = Logger('out.txt')\nds = Cached('c.pt')\n",
    })
    m = build(script.read_text(), str(script))
    found = project_def(m, _call(m, "Logger").func)
    assert found is not None and found[2] == "utils/logger.py"
    assert writing_class(m, _call(m, "Logger")) == "utils/logger.py:3"
    assert writing_class(m, _call(m, "Cached")) is None


def test_spawn_reads_fn_and_args_positional_or_keyword():
    """``mp.spawn(worker, (cfg,), nprocs=2)``, ``mp.spawn(fn=worker, args=(cfg,))``: one
    reading (model/launch.py) for every caller."""
    from dp2ddp.model.launch import spawn_argument, spawns

    m = build(textwrap.dedent("""
        import torch.multiprocessing as mp

        def worker(i, cfg, world):
            pass

        mp.spawn(worker, (1, 2), nprocs=2)
        mp.spawn(fn=worker, args=(3, 4))
        mp.spawn(elsewhere, args=(5,))
    """))
    a, b, c = spawns(m)
    assert a.target is b.target is m.module_functions["worker"] and c.target is None
    assert [m.source(spawn_argument(m, s, "cfg")) for s in (a, b)] == ["1", "3"]
    assert m.source(spawn_argument(m, b, "world")) == "4" and spawn_argument(m, a, "i") is None


def test_branches_around_a_node_say_which_branch_holds_it():
    m = build(textwrap.dedent("""
        def f(a, b):
            if a:
                try:
                    x = 1
                except ValueError:
                    y = 2 if b else 3
            else:
                z = 4
    """))
    x, y, z = (next(n for n in m.nodes(ast.Assign) if n.targets[0].id == v) for v in "xyz")
    assert [(type(a).__name__, w) for a, w in m.branches(x)] == [("Try", "body"), ("If", "body")]
    assert [(type(a).__name__, w) for a, w in m.branches(y.value.body)] == [("IfExp", "body"), ("Try", "handlers"), ("If", "body")]
    assert [(type(a).__name__, w) for a, w in m.branches(z)] == [("If", "orelse")]
    assert [(type(a).__name__, w) for a, w in m.branches(x, stop=(ast.Try,))] == []


def test_per_sample_draws_are_those_sized_by_a_value_the_step_makes():
    """``per_sample_draws``: a draw in the training loop whose first size dimension is the size
    of a value the loop binds (directly, through a name, in a size tuple or ``size=``), and no
    other: not one of a fixed size, not a scalar, not one sized by something made before the
    loop, not one in the model's forward, not ``randperm`` (a permutation of the rank's rows)."""
    from dp2ddp.model.noise import per_sample_draws

    src = textwrap.dedent("""\
        import torch
        class Net(torch.nn.Module):
            def forward(self, x):
                return x + torch.randn(x.size(0), 4)
        n_fixed = 16
        model = torch.nn.DataParallel(Net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for data in loader:
            x = data[0]
            b = x.size(0)
            z1 = torch.randn(b, 4)
            z2 = torch.randint(0, 10, (x.shape[0],))
            z3 = torch.rand(size=(len(x), 2))
            z4 = torch.randn(data[0].size(0), 4)
            k1 = torch.randn(8, 4)
            k2 = torch.rand(1)
            k3 = torch.randn(n_fixed, 4)
            k4 = torch.randperm(x.size(0))
            model(x + z1 + z4).sum().backward()
            opt.step()
        """)
    m = build(src, "train.py")
    got = sorted(m.source(d.call) for d in per_sample_draws(m))
    assert got == sorted([
        "torch.randn(b, 4)", "torch.randint(0, 10, (x.shape[0],))", "torch.rand(size=(len(x), 2))",
        "torch.randn(data[0].size(0), 4)",
    ])
    counts = {m.source(d.call): m.source(d.count) for d in per_sample_draws(m)}
    assert counts["torch.randint(0, 10, (x.shape[0],))"] == "x.shape[0]"


def test_draws_shaped_like_a_batch_tensor_are_per_sample_and_a_loss_shaped_one_is_not():
    from dp2ddp.model.noise import per_sample_draws

    src = textwrap.dedent("""\
        import torch
        model = torch.nn.DataParallel(torch.nn.Linear(4, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, data in enumerate(loader):
            img, _ = data
            img = img.cuda()
            a = torch.randn_like(img)
            b = torch.FloatTensor(img.size()).normal_(mean=0, std=0.1)
            c = torch.randn(img.shape)
            d = torch.zeros_like(data[0]).uniform_()
            loss = (model(img + a + b + c + d) ** 2).mean()
            k = torch.rand_like(loss)
            w = torch.randn_like(model.module.weight)
            loss.backward()
            opt.step()
        """)
    m = build(src, "train.py")
    got = sorted(m.source(d.call) for d in per_sample_draws(m) if d.count is None)
    assert got == sorted([
        "torch.randn_like(img)", "torch.FloatTensor(img.size()).normal_(mean=0, std=0.1)", "torch.randn(img.shape)",
        "torch.zeros_like(data[0]).uniform_()",
    ])


def test_numpy_draws_sized_by_the_batch_and_draws_in_a_loop_over_its_items():
    """NumPy draws count by their ``size`` (keyword or position) or their dimensions, and are
    told from torch's (``tensor=False``: no ``.chunk``); a draw of any stream inside a
    ``for k in range(<the batch's size>)`` of the step is an item loop's, once per loop
    (the epoch loop holds the step too); one inside a loop of a fixed count is not."""
    from dp2ddp.model.noise import draws_per_item, per_sample_draws

    src = textwrap.dedent("""\
        import numpy as np
        import random
        import torch
        model = torch.nn.DataParallel(torch.nn.Linear(4, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch in range(3):
            for img in loader:
                n = img.size(0)
                a = np.random.uniform(0, 55, size=n)
                b = np.random.normal(0.0, 1.0, n)
                c = np.random.randn(img.shape[0], 4)
                d = np.random.uniform(0, 1)
                e = np.random.beta(1.0, 1.0)
                noise = torch.zeros(img.size())
                for k in range(noise.size()[0]):
                    noise[k] = torch.FloatTensor(4).normal_(0, a[k])
                for j in range(len(img)):
                    if random.random() < 0.5:
                        img[j] = img[j].flip(0)
                for t in range(4):
                    noise += torch.randn(4)
                model(img + noise).sum().backward()
                opt.step()
        """)
    m = build(src, "train.py")
    numpy = {m.source(d.call): m.source(d.count) for d in per_sample_draws(m) if not d.tensor}
    assert numpy == {"np.random.uniform(0, 55, size=n)": "n", "np.random.normal(0.0, 1.0, n)": "n",
                     "np.random.randn(img.shape[0], 4)": "img.shape[0]"}
    loops = [(loop.lineno, m.source(draw)) for loop, draw in draws_per_item(m)]
    assert loops == [(15, "torch.FloatTensor(4).normal_(0, a[k])"), (17, "random.random()")]


def test_a_tensorboard_logger_logger_is_made_on_rank_0_only():
    """``tensorboard_logger.Logger(logdir)`` writes an event file like a SummaryWriter: the
    migration makes it on rank 0 only (one event file, as the original wrote)."""
    from dp2ddp.migrate import migrate_source

    src = textwrap.dedent("""\
        import tensorboard_logger as tb_logger
        import torch
        import torch.nn as nn
        model = nn.DataParallel(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        logger = tb_logger.Logger(logdir="tb", flush_secs=2)
        for epoch in range(2):
            loss = model(torch.randn(8, 4)).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            logger.log_value("loss", loss.item(), epoch)
        """)
    out = migrate_source(src.encode(), "train.py").output.decode()
    assert 'logger = tb_logger.Logger(logdir="tb", flush_secs=2) if dist.get_rank() == 0 else None' in out
    assert "if dist.get_rank() == 0:\n        logger.log_value(" in out


def test_a_pandas_frame_written_by_name_is_a_save_and_runs_on_rank_zero():
    """``data_frame.to_csv(path)`` writes a file like ``torch.save``: a writer of kind
    ``save``, and the migration runs it on rank 0 only (as SRFBN's records of every epoch)."""
    from dp2ddp.migrate import migrate_source
    from dp2ddp.model.writers import writers

    src = textwrap.dedent('''\
        import pandas as pd
        import torch
        import torch.nn as nn

        model = nn.DataParallel(nn.Linear(2, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        records = {"loss": []}
        for epoch in range(2):
            opt.zero_grad()
            loss = model(torch.randn(4, 2)).pow(2).mean()
            loss.backward()
            opt.step()
            records["loss"].append(loss.item())
            pd.DataFrame(records).to_csv("records.csv", index_label="epoch")
        ''')
    saves = [w for w in writers(build(src)) if w.kind == "save"]
    assert [(w.call.lineno, ast.literal_eval(w.path)) for w in saves] == [(14, "records.csv")]
    res = migrate_source(src.encode(), "train.py")
    assert not res.migration.blocked, [f.message for f in res.migration.warnings]
    out = res.output.decode()
    guarded = out.split('pd.DataFrame(records).to_csv("records.csv", index_label="epoch")')[0].rstrip().splitlines()[-1]
    assert guarded.strip().startswith("if ") and "get_rank()" in guarded and guarded.rstrip().endswith(":"), out


def test_a_folder_moved_away_two_modules_below_the_script_is_a_race(tmp_path):
    """``option.parse()`` -> ``util.mkdir_and_rename()`` (a module of another package): an
    earlier run's folder is renamed and a new one made. Followed across both modules, the
    call races on every rank (rank 1 would move rank 0's new folder away)."""
    from dp2ddp.model.companion_writes import companion_folder_races

    project = ROOT / "fixtures" / "project" / "archive_on_start"
    m = build((project / "train.py").read_text(), str(project / "train.py"))
    (race,) = companion_folder_races(m)
    assert (race.call.lineno, race.name, race.where, race.deletes, race.checked) == (
        13, "parse", "utils/util.py:12", "utils/util.py:11", False)


def test_a_project_dataparallel_that_only_adds_replication_callbacks_is_a_sync_bn_wrap(tmp_path):
    """The vendored synchronized-BatchNorm package's DataParallelWithCallback (it overrides
    only ``replicate``: DataParallel's own, then callbacks on the copies) is a wrap whose
    migration converts BatchNorm; a subclass that changes anything else is not."""
    from dp2ddp.model.sync_bn import callback_class
    from dp2ddp.model.wraps import dp_wraps, unresolved_dp
    from dp2ddp.project import helpers_with_dp

    (tmp_path / "sync_batchnorm.py").write_text((ROOT / "fixtures" / "sync_bn" / "sync_batchnorm.py").read_text())
    (tmp_path / "other.py").write_text(textwrap.dedent('''\
        from torch.nn.parallel import DataParallel


        def hook(copies):
            pass


        class SkipsSuper(DataParallel):
            def replicate(self, module, device_ids):
                copies = [module for _ in device_ids]
                hook(copies)
                return copies


        class AlsoScatters(DataParallel):
            def replicate(self, module, device_ids):
                copies = super().replicate(module, device_ids)
                hook(copies)
                return copies

            def scatter(self, inputs, kwargs, device_ids):
                return super().scatter(inputs, kwargs, device_ids)
        '''))
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent('''\
        import torch.nn as nn
        from sync_batchnorm import DataParallelWithCallback
        from other import AlsoScatters, SkipsSuper

        a = DataParallelWithCallback(nn.BatchNorm1d(3))
        b = SkipsSuper(nn.Linear(2, 2))
        c = AlsoScatters(nn.Linear(2, 2))
        '''))
    m = build(script.read_text(), str(script))
    calls = sorted((c for c in m.nodes(ast.Call) if isinstance(c.func, ast.Name) and c.func.id[0].isupper()), key=lambda c: c.lineno)
    assert [getattr(callback_class(m, c), "name", None) for c in calls] == ["DataParallelWithCallback", None, None]
    assert [(w.call.lineno, w.sync_bn) for w in dp_wraps(m)] == [(5, True)]
    assert unresolved_dp(m) == []
    # the other two reach DataParallel in a project module: refused with DDP151, as before
    assert sorted(call.lineno for call, _rel, _line in helpers_with_dp(m)) == [6, 7]


def test_a_loss_divided_by_a_count_of_its_batch_is_found_and_one_divided_by_the_model_output_is_not() -> None:
    from dp2ddp.model.core import build
    from dp2ddp.model.valid_means import count_means

    head = ("import torch\nimport torch.nn as nn\nmodel = nn.DataParallel(nn.Linear(4, 2))\n"
            "opt = torch.optim.SGD(model.parameters(), lr=0.1)\nfor x, y, w in loader:\n    out = model(x)\n")
    tail = "    opt.zero_grad()\n    loss.backward()\n    opt.step()\n"
    found = {
        "    loss = (out.sum(1) * (y > 0)).sum() / (y > 0).sum()\n": "(y > 0).sum()",
        "    mask = (y != 0).float()\n    loss = (out.sum(1) * mask).sum() / mask.sum().clamp(min=1)\n": "mask.sum()",
        "    n = torch.count_nonzero(y)\n    loss = out.sum() / max(1, n)\n": "n",
        "    loss = (out.sum(1) * w).sum() / torch.sum(w)\n": "torch.sum(w)",
    }
    for body, count in found.items():
        m = build(head + body + tail)
        got = count_means(m)
        assert [m.source(c.count) for c in got] == [count], body
    for body in ("    loss = out.sum() / out.abs().sum()\n",  # the model's output: it carries a gradient
                 "    loss = out.sum() / x.size(0)\n",  # the batch size: a plain mean
                 "    loss = out.sum() / torch.tensor(3.0).sum()\n",  # a constant, not the batch's
                 # a count dividing something inside the loss (logits), not the loss itself
                 "    loss = nn.functional.cross_entropy(out / (y > 0).sum(), y)\n"):
        assert count_means(build(head + body + tail)) == [], body


def test_a_checkpoint_read_from_a_path_alike_on_every_rank_is_alike():
    """``start = torch.load(args.resume)["epoch"]``: every rank reads the same file, so a loop
    ``for epoch in range(start, args.epochs)`` takes the same passes everywhere; a path that
    names the rank, or one drawn at random, is not the same file."""
    from dp2ddp.model.rank_alike import same_on_every_rank

    src = textwrap.dedent("""\
        import argparse, os, random
        import torch
        args = argparse.ArgumentParser().parse_args()
        start = 0
        if args.resume:
            start = torch.load(args.resume, map_location="cpu")["epoch"]
        mine = torch.load("ckpt_%d.pth" % int(os.environ["RANK"]))["epoch"]
        drawn = torch.load(random.choice(["a.pth", "b.pth"]))["epoch"]
        for a in range(start, 10):
            pass
        for b in range(mine, 10):
            pass
        for c in range(drawn, 10):
            pass
        """)
    m = build(src, "train.py")
    loops = {n.target.id: n.iter for n in m.nodes(ast.For)}
    assert same_on_every_rank(m, loops["a"])
    assert not same_on_every_rank(m, loops["b"])
    assert not same_on_every_rank(m, loops["c"])


def test_a_console_helper_only_writes_to_the_terminal():
    """``log_helpers.console_helper``: a project function that draws on the terminal and returns
    nothing (its clock helper included); not one that also returns a value, writes a file, or
    is not the project's."""
    from pathlib import Path

    from dp2ddp.model.log_helpers import console_helper

    here = Path(__file__).resolve().parent.parent / "fixtures" / "rank_zero"
    src = ("import os\nfrom termbar import bar_and_count, bar_to_file, progress_bar\n"
           "progress_bar(0, 4, 'x')\nbar_and_count(0, 4)\nbar_to_file(0, 4, 'log.txt')\nos.getcwd()\n")
    m = build(src, str(here / "probe_script.py"))
    got = {m.source(c.func): console_helper(m, c) for c in m.nodes(ast.Call) if isinstance(c.func, ast.Name)}
    assert got == {"progress_bar": "progress_bar", "bar_and_count": None, "bar_to_file": None}


def test_a_loss_class_returning_a_total_is_a_sum_here_or_in_a_project_module(tmp_path) -> None:
    from dp2ddp.model.losses import summed_losses

    classes = {
        "functional": "class Crit(nn.Module):\n    def __init__(self, w=1.0):\n        super().__init__()\n"
                      "        self.w = w\n\n    def forward(self, out, y):\n"
                      "        return self.w * F.cross_entropy(out, y, reduction='sum')\n",
        "held": "class Crit(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                "        self.l1 = nn.L1Loss(reduction='sum')\n\n    def forward(self, out, y):\n"
                "        err = self.l1(out, y)\n        return err + 0.5 * (out - y).pow(2).sum()\n",
        # a total on one path, a mean on the other: refused (scaling would scale the mean too)
        "mean": "class Crit(nn.Module):\n    def forward(self, out, y):\n        if out.dim() > 1:\n"
                "            return F.l1_loss(out, y, reduction='sum')\n        return F.l1_loss(out, y)\n",
        # divided by the batch inside: a mean
        "per_sample": "class Crit(nn.Module):\n    def forward(self, out, y):\n"
                      "        return F.l1_loss(out, y, reduction='sum') / out.size(0)\n",
    }
    head = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n"
    loop = ("model = nn.DataParallel(nn.Linear(4, 2))\ncrit = Crit()\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "for x, y in loader:\n    loss = crit(model(x), y)\n    opt.zero_grad()\n    loss.backward()\n    opt.step()\n")
    for name, cls in classes.items():
        here = build(head + cls + loop)
        (tmp_path / name).mkdir()
        (tmp_path / name / "crits.py").write_text(head + cls)
        train = tmp_path / name / "train.py"
        train.write_text(head + "from crits import Crit\n" + loop)
        there = build(train.read_text(), str(train))
        for m in (here, there):
            got = [(m.source(s.use), s.scalable) for s in summed_losses(m)]
            want = {"functional": [("crit(model(x), y)", True)], "held": [("crit(model(x), y)", True)],
                    "mean": [("crit(model(x), y)", False)], "per_sample": []}[name]
            assert got == want, (name, m.path)
        if name == "mean":
            assert "returns `F.l1_loss(out, y)`" in summed_losses(there)[0].reason


def test_a_model_a_project_factory_places_is_placed_and_one_it_does_not_is_not(tmp_path) -> None:
    from dp2ddp.model.placed_elsewhere import placed_by_maker
    from dp2ddp.model.wraps import dp_wraps

    src = ROOT / "fixtures" / "wrap_ddp"
    zoo = (src / "model_zoo.py").read_text()
    for places in (True, False):
        d = tmp_path / str(places)
        d.mkdir()
        (d / "model_zoo.py").write_text(zoo if places else zoo.replace("        model.cuda()\n", "        pass\n"))
        train = d / "train.py"
        train.write_text((src / "placed_by_the_projects_model_factory.in.py").read_text())
        m = build(train.read_text(), str(train))
        assert placed_by_maker(m, dp_wraps(m)[0].module) is places


def test_a_receiver_rebound_by_its_own_methods_is_followed_once_per_call(tmp_path, monkeypatch) -> None:
    """`x = x.m1(); x = x.m2(); ...` (a text cleaner's 29 `s = s.replace(...)` lines): every
    binding of `x` is an origin of every other, and resolving each call's method explored
    them in every order (n! steps: 29 lines ran for minutes). Each call is resolved once
    now, however the calls reach one another."""
    from dp2ddp.model import project_defs

    n = 7
    body = "".join(f"    x = x.m{i}()\n" for i in range(n))
    train = _write(tmp_path, {"train.py": "import torch\n\n\ndef clean(x):\n" + body + "    return x\n\n\n"
                              "net = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"})
    m = build(train.read_text(), str(train))
    calls = []
    real = project_defs._resolve_instance_method
    monkeypatch.setattr(project_defs, "_resolve_instance_method", lambda mm, f: calls.append(f) or real(mm, f))
    for c in m.nodes(ast.Call):
        project_def(m, c.func)
    assert len(calls) <= n * (n + 2), len(calls)  # each call once per question asked (n! before)


ORDER_SRC = textwrap.dedent('''
    import torch.nn as nn

    def helper_c():
        return 3

    def helper_a():
        return helper_c()

    def helper_b():
        return 2

    def step():
        helper_b()
        helper_a()

    if flag == 1:
        crit = nn.CrossEntropyLoss()
    elif flag == 2:
        crit = nn.MSELoss()
    elif flag == 3:
        crit = nn.L1Loss()
    else:
        crit = nn.SmoothL1Loss()
    crit(x, y)
''')


def test_value_origins_come_in_source_order():
    """Where a value may come from several places, ``origins`` lists them in the order they are
    written, not in the order a set of nodes happens to iterate (by address): a reader that
    takes the first match decides the same way on every run (kaidic/LDAM-DRW's loss on if/elif
    paths was refused in some runs and migrated in others)."""
    from dp2ddp.model.flow import origins

    m = build(ORDER_SRC.encode(), "t.py")
    use = next(c for c in m.nodes(ast.Call) if isinstance(c.func, ast.Name) and c.func.id == "crit")
    found = [node.func.attr for node, _ in origins(m, use.func)]
    assert found == ["CrossEntropyLoss", "MSELoss", "L1Loss", "SmoothL1Loss"]


def test_the_functions_a_call_reaches_iterate_in_source_order():
    m = build(ORDER_SRC.encode(), "t.py")
    step = next(f for f in m.nodes(ast.FunctionDef) if f.name == "step")
    assert [f.name for f in m.reach(step)] == ["helper_c", "helper_a", "helper_b", "step"]


GATHERS = textwrap.dedent('''
    import torch
    import torch.distributed as dist

    class Returned(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
            dist.all_gather(out, x)
            return tuple(out)

        @staticmethod
        def backward(ctx, *grads):
            return grads[dist.get_rank()]

    class Copied(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
            dist.all_gather(out, x)
            return tuple(out)

        @staticmethod
        def backward(ctx, *grads):
            (x,) = ctx.saved_tensors
            grad_out = torch.zeros_like(x)
            grad_out[:] = grads[dist.get_rank()]
            return grad_out

    class Summed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]
            dist.all_gather(out, x)
            return tuple(out)

        @staticmethod
        def backward(ctx, *grads):
            every = torch.stack(grads)
            dist.all_reduce(every)
            return every[dist.get_rank()]
''')


def test_a_gather_whose_backward_keeps_its_own_slice_unsummed_is_told_from_one_that_sums():
    from dp2ddp.model.gathers import unsummed_gather

    m = build(GATHERS.encode(), "g.py")
    found = {c.name: unsummed_gather(m, c) for c in m.nodes(ast.ClassDef)}
    assert found == {"Returned": 14, "Copied": 28, "Summed": None}


_AWP_TRAIN = '''
import argparse
import os
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--fname", default="out")
parser.add_argument("--resume", type=int, default=0)
args = parser.parse_args()
model = nn.DataParallel(nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start_epoch = 1
if args.resume:
    start_epoch = args.resume
    model.load_state_dict(torch.load(os.path.join(args.fname, f"model_{start_epoch - 1}.pth")))
loader = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4, shuffle=True)
for epoch in range(start_epoch, start_epoch + 2):
    for x, y in loader:
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    torch.save(model.state_dict(), os.path.join(args.fname, f"model_{epoch}.pth"))
'''


def test_an_unconditional_wrap_keeps_module_keys_beside_a_sibling_that_resumes_its_own_files_bare(tmp_path: Path) -> None:
    """AWP's AT_AWP folder: train_cifar10.py wraps unconditionally (every run, CPU included,
    wrote `module.` keys) and resumes its own model_{epoch}.pth into the wrapper;
    train_cifar100.py, beside it, wraps nothing and resumes *its* model_{epoch}.pth into the
    bare model. That strict bare load never read train_cifar10.py's files (it would have failed
    on them), so it does not decide their keys: the migration writes `module.` keys as the
    original did, and the original's own --resume can read them."""
    from dp2ddp.migrate import migrate_source

    sibling = _AWP_TRAIN.replace('model = nn.DataParallel(nn.Linear(4, 1))', 'model = nn.Linear(4, 1)')
    path = _write(tmp_path, {"train.py": _AWP_TRAIN, "train_cifar100.py": sibling})
    out = migrate_source(path.read_bytes(), str(path)).output.decode()
    assert 'torch.save(model.state_dict(), os.path.join(args.fname, f"model_{epoch}.pth"))' in out
    assert "model.module.state_dict()" not in out
    # the control: beside a guarded wrap (one GPU wrote plain keys), that bare load decides
    guarded = _AWP_TRAIN.replace('model = nn.DataParallel(nn.Linear(4, 1))',
                                 'model = nn.Linear(4, 1)\nif torch.cuda.device_count() > 1:\n    model = nn.DataParallel(model)')
    path = _write(tmp_path / "guarded", {"train.py": guarded, "train_cifar100.py": sibling})
    out = migrate_source(path.read_bytes(), str(path)).output.decode()
    assert "model.module.state_dict()" in out


def test_a_write_of_the_training_batch_is_a_share_of_it_and_one_of_fixed_noise_is_not():
    """dcgan's shape (fixtures/rank_zero/grid_of_the_batch_...): the real batch saved in the
    epoch loop is (part of) what the loop iterates, so under DDP rank 0 writes its share of it
    (DDP190); the fakes of a fixed noise are not the batch; a save outside every training loop
    has no batch."""
    from dp2ddp.migrate import migrate_file
    from dp2ddp.model.batch_shapes import written_batch_shares

    path = ROOT / "fixtures" / "rank_zero" / "grid_of_the_batch_written_on_rank_zero_holds_its_share.in.py"
    m = build(path.read_bytes(), str(path))
    found = [(m.source(arg), call.lineno) for stmt in m.nodes(ast.Expr) for call, arg in written_batch_shares(m, stmt)]
    assert found == [("real.detach().cpu()", 28)]
    after = build(path.read_bytes() + b'torch.save(data.tensors[0], "all.pt")\n', str(path))
    assert [(after.source(a), c.lineno) for s in after.nodes(ast.Expr) for c, a in written_batch_shares(after, s)] == found
    notes = [f for f in migrate_file(str(path)).migration.findings if f.code == "DDP190"]
    assert [(f.line, "writes `real.detach().cpu()`, part of the training batch" in f.message) for f in notes] == [(28, True)]


def test_a_wrapper_made_only_to_read_module_keys_is_no_wrap():
    """osmr/imgclsmob's ``net_tmp = DataParallel(net)``: loaded into, its ``.module``'s state
    read back, nothing else: a key-only wrap (not a DataParallel to migrate, and check's DDP001
    does not report it). Called, handed on, or holding its own name's model: a wrap."""
    from dp2ddp.model.wraps import dp_wraps, key_only_wraps
    from dp2ddp.rules import RULES

    head = "import torch\nimport torch.nn as nn\n\n\ndef load(net, ckpt):\n    tmp = nn.DataParallel(net)\n"
    cases = {
        "reads_keys_only": (head + "    tmp.load_state_dict(ckpt)\n    net.load_state_dict(tmp.module.state_dict())\n", True),
        "called": (head + "    tmp.load_state_dict(ckpt)\n    return tmp(torch.ones(1, 4))\n", False),
        "handed_on": (head + "    tmp.load_state_dict(ckpt)\n    keep(tmp)\n", False),
        "returned": (head + "    tmp.load_state_dict(ckpt)\n    return tmp\n", False),
        "never_loaded": (head + "    net.load_state_dict(tmp.module.state_dict())\n", False),
        "its_own_name": (head.replace("tmp = nn.DataParallel(net)", "net = nn.DataParallel(net)")
                         + "    net.load_state_dict(ckpt)\n", False),
    }
    ddp001 = next(r for r in RULES if r.code == "DDP001")
    for why, (src, key_only) in cases.items():
        m = build(src.encode(), "t.py")
        assert bool(key_only_wraps(m)) is key_only, why
        assert bool(dp_wraps(m)) is not key_only, why
        assert bool(list(ddp001.check(m))) is not key_only, why


def test_a_self_attribute_holds_the_store_just_before_it_in_straight_line_and_no_other():
    """``self.dir`` read right after ``self.dir = ...`` in the same block (or a block around
    it) holds that value alone; a loop that stores it again later, a try whose body stores
    it, a method call between (``self.pick()``, ``super().f()``, ``helper(self)``) and a
    read inside a lambda leave every store of the class possible."""
    from dp2ddp.model.stores import store_just_before

    m = build(textwrap.dedent('''
        class Run:
            def __init__(self, a, b):
                self.d = a
                if a:
                    self.d = b
                else:
                    self.d = a + 1
                    seen(self.d)      # a + 1
                seen(self.d)          # either branch's
                self.e = a
                for i in b:
                    seen(self.e)      # a, then b: stored again later in the loop
                    self.e = b
                self.f = a
                try:
                    self.f = b
                except E:
                    seen(self.f)      # a or b
                self.g = a
                super().pick(b)
                seen(self.g)          # pick may store it
                self.h = a
                helper(self)
                seen(self.h)          # so may a helper handed self
                self.k = a
                cb = lambda: self.k   # called who knows when
                with open(self.k) as fh:
                    seen(self.k)      # a: opening a file named by it stores nothing
    '''))
    held = {}
    for call in m.nodes(ast.Call):
        if m.source(call.func) == "seen" or isinstance(call.func, ast.Name) and call.func.id == "open":
            v = store_just_before(m, call.args[0])
            held.setdefault(m.source(call.args[0]), []).append(None if v is None else m.source(v))
    lam = next(n for n in m.nodes(ast.Lambda))
    assert store_just_before(m, lam.body) is None
    assert held == {"self.d": ["a + 1", None], "self.e": [None], "self.f": [None], "self.g": [None], "self.h": [None],
                    "self.k": ["a", "a"]}


def test_a_step_decided_by_a_loss_summed_over_micro_batches_in_a_method_is_found():
    """SRFBN's ``train_step``: the batch is split, each split's loss goes backward and is added
    up, then one step under a test of the sum; and a solver whose method makes one step a
    call. Both steps are decided by the loss (they used to be found only in a loop that both
    goes backward and steps)."""
    from dp2ddp.model.steps import loss_decided_steps

    m = build(textwrap.dedent('''
        class Solver:
            def train_step(self):
                self.optimizer.zero_grad()
                loss_batch = 0.0
                for i in range(self.split_batch):
                    loss_sbatch = self.criterion(self.model(self.LR[i]), self.HR[i]) / self.split_batch
                    loss_sbatch.backward()
                    loss_batch += loss_sbatch.item()
                if loss_batch < self.skip_threshold * self.last_epoch_loss:
                    self.optimizer.step()
                    self.last_epoch_loss = loss_batch
                return loss_batch

            def plain_step(self, x, y):
                loss = self.criterion(self.model(x), y)
                loss.backward()
                if torch.isfinite(loss):
                    self.optimizer.step()

            def always(self, x, y):
                loss = self.criterion(self.model(x), y)
                loss.backward()
                self.optimizer.step()
    '''))
    found = [(m.enclosing_function(step).name, m.source(read), m.source(loss)) for step, _t, read, loss in loss_decided_steps(m)]
    assert found == [("train_step", "loss_batch", "loss_sbatch"), ("plain_step", "loss", "loss")]


def test_the_sync_bn_packages_rewrap_of_a_dataparallel_wraps_nothing_but_a_trainers_wrap_does(tmp_path):
    """The vendored sync-BN package's ``convert_model`` hands back a DataParallel it was handed
    as a DataParallelWithCallback (under ``isinstance(module, DataParallel)``): it wraps nothing
    a migrated script hands it, so a script importing it (SimCLR's Lightning script) has nothing
    to migrate. A trainer module that wraps its own model in that class (SPADE's) wraps."""
    from dp2ddp.project import only_checks_dp

    (tmp_path / "sync_batchnorm.py").write_text((ROOT / "fixtures" / "sync_bn" / "sync_batchnorm.py").read_text())
    (tmp_path / "convert.py").write_text(textwrap.dedent('''\
        import torch
        from sync_batchnorm import DataParallelWithCallback


        def convert_model(module):
            if isinstance(module, torch.nn.DataParallel):
                mod = convert_model(module.module)
                return DataParallelWithCallback(mod, device_ids=module.device_ids)
            return module
        '''))
    (tmp_path / "trainer.py").write_text(textwrap.dedent('''\
        import torch.nn as nn
        from sync_batchnorm import DataParallelWithCallback


        class Trainer:
            def __init__(self, gpu_ids):
                self.model = nn.Linear(2, 2)
                if len(gpu_ids) > 0:
                    self.model = DataParallelWithCallback(self.model, device_ids=gpu_ids)
        '''))
    assert only_checks_dp(str(tmp_path / "convert.py")) and not only_checks_dp(str(tmp_path / "trainer.py"))
