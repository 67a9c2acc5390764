"""Tiny deterministic setup steps for recipes-sample16.tsv (MPRNet, mdistiller; our own code):
python mk16a.py STEP [ARGS] [+ STEP ARGS]...   (steps joined by a lone '+', as in mk15.py)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np


def rng(tag):
    import zlib
    return np.random.RandomState(zlib.crc32(tag.encode()) & 0x7FFFFFFF)


def mprnet(ntrain="8", nval="4", side="64", ps="32", bs="2", epochs="2"):
    """MPRNet Deblurring (run from Deblurring/): PNG pairs under Datasets/GoPro/{train,test}/{input,target}
    (input = target + noise, same file names), and training.yml made short: BATCH_SIZE, NUM_EPOCHS,
    VAL_AFTER_EVERY 1 (so model_best/model_epoch_N are written), TRAIN_PS/VAL_PS = ps."""
    from PIL import Image
    s = int(side)
    for split, n in (("train", int(ntrain)), ("test", int(nval))):
        r = rng("mprnet/" + split)
        for sub in ("input", "target"):
            os.makedirs(os.path.join("Datasets", "GoPro", split, sub), exist_ok=True)
        for i in range(n):
            tar = r.randint(0, 256, size=(s, s, 3)).astype("float32")
            inp = np.clip(tar + r.normal(0, 20, size=tar.shape), 0, 255)
            name = "%s_%03d.png" % (split, i)
            Image.fromarray(tar.astype("uint8")).save(os.path.join("Datasets", "GoPro", split, "target", name))
            Image.fromarray(inp.astype("uint8")).save(os.path.join("Datasets", "GoPro", split, "input", name))
    y = open("training.yml").read()
    for key, val in (("BATCH_SIZE", bs), ("NUM_EPOCHS", epochs), ("VAL_AFTER_EVERY", "1"),
                     ("TRAIN_PS", ps), ("VAL_PS", ps)):
        y, k = re.subn(r"^(\s*%s:\s*)\S+" % key, r"\g<1>%s" % val, y, count=1, flags=re.M)
        assert k == 1, key
    open("training.yml", "w").write(y)


def mprnet_compat():
    """train.py sums the per-stage losses with torch.sum([...]) over a Python list, which current torch
    refuses ("argument 'input' must be Tensor, not list"); those two calls become the builtin sum([...])
    (same value, same graph). Nothing dp2ddp reads or writes changes."""
    src = open("train.py").read()
    new = src.replace("torch.sum([criterion_", "sum([criterion_")
    assert new.count("sum([criterion_") == 2 and new != src, "loss lines not found"
    open("train.py", "w").write(new)


def pip_local(path):
    """pip-install a package shipped inside the repository (e.g. ../pytorch-gradual-warmup-lr) into this
    python, from a temporary copy (nothing is written into the repository copy)."""
    with tempfile.TemporaryDirectory() as d:
        dst = os.path.join(d, "pkg")
        shutil.copytree(path, dst)
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", dst])


def pip(*packages):
    """pip-install into this python whatever of PACKAGES is absent (pip names)."""
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *packages])


def mdk_tools(cfg="configs/cifar100/vanilla.yaml"):
    """mdistiller (run from tools/): the repository expects `python setup.py develop` (an install that would
    point every copy of the run at one folder); instead the package is copied beside the script
    (tools/mdistiller, identical code, so `import mdistiller` finds it from tools/, and the migrated copy
    carries its own), and the config is copied beside it as tools/<name>.yaml (verify copies the workdir
    only). CIFAR-100 comes from the realrun shim (root: tools/mdistiller/../../data = tools/data)."""
    shutil.copytree(os.path.join("..", "mdistiller"), "mdistiller")
    shutil.copy(os.path.join("..", cfg), os.path.basename(cfg))


if __name__ == "__main__":
    argv, step = sys.argv[1:], []
    for a in argv + ["+"]:
        if a == "+":
            if step:
                globals()[step[0].replace("-", "_")](*step[1:])
            step = []
        else:
            step.append(a)
