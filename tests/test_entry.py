"""Is a file a training script to migrate (dp2ddp.codemods.entry)? An inference script that
hands its model to the project's own code is still inference when nothing it reaches trains
(project.trains_nowhere); a library module is refused alone (DDP116), also one that only
tests for DataParallel and a package ``__init__`` that settles matplotlib at import."""

from __future__ import annotations

from pathlib import Path

import pytest

from dp2ddp.cli import main

PREDICT = """\
import torch
import torch.nn as nn
from models import Net
from predictor import Predictor


def get_predictor(model, out):
    return Predictor(model, out)


def main():
    model = Net()
    model.load_state_dict(torch.load("net.pth"))
    if torch.cuda.device_count() > 1:
        model = nn.DataParallel(model)
    predictor = get_predictor(model, "out")
    predictor.run()


if __name__ == "__main__":
    main()
"""

MODELS = "import torch.nn as nn\n\n\nclass Net(nn.Linear):\n    def __init__(self):\n        super().__init__(4, 2)\n"

PREDICTOR = """\
import torch
{extra}

class Predictor:
    def __init__(self, model, out):
        self.model, self.out = model, out

    def run(self):
        with torch.no_grad():
            for x in torch.randn(8, 3, 4):
                torch.save(self.model(x), self.out)
{step}"""


def _write(tmp_path: Path, predictor_extra: str = "", step: str = "") -> Path:
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "predictor.py").write_text(PREDICTOR.format(extra=predictor_extra, step=step))
    script = tmp_path / "predict.py"
    script.write_text(PREDICT)
    return script


def test_an_inference_script_handing_its_model_to_a_project_predictor_is_refused(tmp_path: Path, capsys) -> None:
    """pytorch-3dunet's predict.py: the wrapped model goes to a predictor class of the project
    that never trains. Every rank would repeat the whole inference: DDP115, nothing written."""
    script = _write(tmp_path)
    assert main(["rewrite", str(script)]) == 1
    err = capsys.readouterr().err
    assert "predict.py:15:17: DDP115 no training step in this file" in err
    assert not (tmp_path / "predict_ddp.py").exists()


def test_a_handed_model_trained_in_another_project_module_is_a_training_one(tmp_path: Path, capsys) -> None:
    """A method of the predictor reaches a backward pass in another project module: the
    script is not judged inference-only (no DDP115); it migrates as a training script would."""
    (tmp_path / "trainer.py").write_text("def train(model, x):\n    model(x).sum().backward()\n")
    script = _write(tmp_path, "from trainer import train\n", "\n    def tune(self):\n        train(self.model, torch.randn(2, 4))\n")
    main(["rewrite", str(script)])
    assert "DDP115" not in capsys.readouterr().err


@pytest.mark.parametrize("extra", [
    "import pytorch_lightning as pl\n",  # a library that trains what it is given, imported where it runs
    "from mystery_engine import fit\n",  # a library dp2ddp does not know
], ids=["lightning_imported", "unknown_library_imported"])
def test_a_handed_model_that_may_train_only_where_dp2ddp_cannot_read_is_refused(tmp_path: Path, capsys, extra: str) -> None:
    """The predictor's module imports a library that may train the model, but nothing dp2ddp
    can read trains it (no backward pass, no step, no optimizer made). If that library only
    evaluates, every rank would repeat the inference; if it trains, no loader can be shown to
    be its data: refused (DDP115) with both readings, the script left as it was. (It used to
    migrate as a training script, sharding any loader whose name said `train`.)"""
    script = _write(tmp_path, extra)
    before = script.read_bytes()
    assert main(["rewrite", str(script)]) == 1
    err = capsys.readouterr().err
    assert ("predict.py:8:12: DDP115 nothing in this script or the project code it runs trains (no backward pass, "
            "no optimizer.step(), no optimizer made), and `model` is handed to `Predictor(...)` (line 8), which may run "
            "code dp2ddp cannot read") in err, err
    assert "cannot find the data it trains on to shard" in err
    assert script.read_bytes() == before and not (tmp_path / "predict_ddp.py").exists()


def test_a_handed_model_with_an_optimizer_made_in_the_script_is_a_training_one(tmp_path: Path, capsys) -> None:
    """The same hand-off to a library dp2ddp does not know, where the script makes an
    optimizer for the model (ignite's ``create_supervised_trainer(model, optimizer, loss)``
    shape): the library trains it, so it migrates as a training script (no DDP115)."""
    script = _write(tmp_path, "from mystery_engine import fit\n")
    script.write_text(script.read_text().replace("    predictor = get_predictor(model, \"out\")\n",
                                                 "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                                                 "    predictor = get_predictor(model, \"out\")\n"))
    assert "torch.optim.SGD" in script.read_text()
    main(["rewrite", str(script)])
    assert "DDP115" not in capsys.readouterr().err


def test_a_model_handed_to_project_code_that_never_reaches_a_backward_is_inference(tmp_path: Path, capsys) -> None:
    """GAN_stability's test.py: the project has a training module (gan_training/train.py,
    imported through config.py), but what the script hands its models to (an evaluator, a
    checkpoint registry, a deep copy given to the evaluator) never reaches it: DDP115."""
    (tmp_path / "trainer.py").write_text("def train(model, x):\n    model(x).sum().backward()\n")
    script = _write(tmp_path, "from trainer import train\n")
    assert main(["rewrite", str(script)]) == 1
    assert "predict.py:15:17: DDP115" in capsys.readouterr().err


LIBRARY_CHECKS = """\
import torch.nn as nn


def unwrap(model):
    if isinstance(model, nn.DataParallel):
        return model.module
    return model
"""

PACKAGE_INIT = """\
import matplotlib
import torch.nn as nn

matplotlib.use("Agg")


class Losses:
    def __init__(self, n_gpus):
        self.loss = nn.L1Loss()
        if n_gpus > 1:
            self.loss = nn.DataParallel(self.loss, range(n_gpus))

    def __call__(self, sr, hr):
        return self.loss(sr, hr)
"""


@pytest.mark.parametrize("rel,source,where", [
    ("utils.py", LIBRARY_CHECKS, "utils.py:5:26"),
    ("loss/__init__.py", PACKAGE_INIT, "loss/__init__.py:11:25"),
    ("losses.py", PACKAGE_INIT, "losses.py:11:25"),
], ids=["only_tests_for_dataparallel", "package_init", "settles_matplotlib_at_import"])
def test_a_library_module_alone_is_refused_with_no_process_group_started_at_import(
        tmp_path: Path, capsys, rel: str, source: str, where: str) -> None:
    """RCAN's loss/__init__.py (a wrap in a class, ``matplotlib.use`` at import) and
    torchreid's utils (an isinstance test only): alone, either would have started a process
    group whenever it was imported. DDP116, with the advice to migrate the script that runs."""
    path = tmp_path / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    assert main(["rewrite", "-o", "-", str(path)]) == 1
    out, err = capsys.readouterr()
    assert f"{where}: DDP116 library module" in err and "--with-helpers" in err
    assert out == source  # left as it was


LOADED_WHOLE = """\
import torch
import torch.nn as nn

model = torch.load("model.pt", map_location="cpu")
if isinstance(model, nn.DataParallel):
    model = model.module
print(model.recognize(torch.randn(2, 4)))
"""

BUILDER = "import torch.nn as nn\n\n\ndef build(n):\n    model = nn.Linear(4, 2)\n    if n > 1:\n        model = nn.DataParallel(model)\n    return model\n"

TRAINS_A_BUILT_MODEL = """\
import torch
import torch.nn as nn
from builder import build


def main():
    model = build(torch.cuda.device_count())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    net = model.module if isinstance(model, nn.DataParallel) else model
    torch.save(net.state_dict(), "w.pt")


if __name__ == "__main__":
    main()
"""


def test_a_script_that_only_unwraps_a_model_loaded_whole_is_left_as_it_was(tmp_path: Path, capsys) -> None:
    """kospeech's inference script: the model is unpickled as the DataParallel the training
    saved. Rewriting its test to name DDP left the loaded wrapper in place (``recognize``
    then fails) and started a process group for nothing: DDP177, nothing written."""
    script = tmp_path / "inference.py"
    script.write_text(LOADED_WHOLE)
    assert main(["rewrite", "-o", "-", str(script)]) == 1
    out, err = capsys.readouterr()
    assert "inference.py:5:22: DDP177 this script wraps no model in DataParallel" in err
    assert out == LOADED_WHOLE


def test_a_script_whose_model_a_project_module_wraps_is_refused_alone_and_migrates_with_it(tmp_path: Path, capsys) -> None:
    """Alone, the script's test would name DDP while the helper still made a DataParallel
    (every rank training the whole of it, keys gaining ``module.``): DDP151. With its helpers
    the two migrate together."""
    (tmp_path / "builder.py").write_text(BUILDER)
    script = tmp_path / "train.py"
    script.write_text(TRAINS_A_BUILT_MODEL)
    assert main(["rewrite", "-o", "-", str(script)]) == 1
    out, err = capsys.readouterr()
    assert "train.py:7:13: DDP151 build() reaches DataParallel in the project module builder.py:7" in err
    assert out == TRAINS_A_BUILT_MODEL
    assert main(["rewrite", "--with-helpers", "-o", str(tmp_path / "out"), str(script)]) == 0
    migrated = (tmp_path / "out" / "train.py").read_text()
    assert "isinstance(model, DistributedDataParallel)" in migrated
    assert "DistributedDataParallel(" in (tmp_path / "out" / "builder.py").read_text()


def test_the_synchronized_batchnorm_package_alone_is_a_library_not_a_subclass_to_migrate_by_hand(tmp_path: Path, capsys) -> None:
    """The vendored synchronized-BatchNorm package's module (a DataParallel subclass that only
    adds replication callbacks, and a patcher): rewritten alone it is refused as a library
    (DDP116, the scripts that call it migrate), not with DDP101's "migrate this subclass by
    hand", which no user should do; the file stays as it was."""
    src = Path(__file__).resolve().parent.parent / "fixtures" / "sync_bn" / "sync_batchnorm.py"
    path = tmp_path / "sync_batchnorm.py"
    path.write_bytes(src.read_bytes())
    assert main(["rewrite", str(path), "--in-place"]) == 1
    err = capsys.readouterr().err
    assert "DDP116 the synchronized-BatchNorm package's DataParallel" in err, err
    assert "DDP101" not in err
    assert path.read_bytes() == src.read_bytes()


def test_a_library_module_whose_trainer_base_wraps_is_refused_as_a_library(tmp_path: Path, capsys) -> None:
    """CenterNet's ``trains/exdet.py``: a trainer subclass of ``BaseTrainer``, whose module wraps
    the model in DataParallel; the subclass module has no entry point. Rewritten alone it is
    refused as a library (DDP116, the script that runs migrates with its helpers), not left
    silent and not told to migrate itself with its helpers (DDP151)."""
    (tmp_path / "base_trainer.py").write_text(
        "import torch.nn as nn\n\n\nclass BaseTrainer:\n    def __init__(self, model):\n        self.model = nn.DataParallel(model)\n")
    lib = tmp_path / "exdet.py"
    lib.write_text("from base_trainer import BaseTrainer\n\n\nclass ExdetTrainer(BaseTrainer):\n    def debug(self):\n        return None\n")
    assert main(["rewrite", str(lib), "-o", str(tmp_path / "out.py")]) == 1
    err = capsys.readouterr().err
    assert "exdet.py:4:20: DDP116 library module" in err and "`BaseTrainer` reaches DataParallel in the project module base_trainer.py:6" in err, err
