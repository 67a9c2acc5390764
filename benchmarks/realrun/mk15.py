"""Tiny deterministic setup steps of recipes-sample15.tsv (our own code): python mk15.py STEP [ARGS] [+ STEP ARGS]..."""
import os
import re
import sys

import numpy as np


def rng(tag):
    import zlib
    return np.random.RandomState(zlib.crc32(tag.encode()) & 0x7FFFFFFF)


def tsm(ntrain="8", nval="4", frames="6", side="40", classes="51"):
    """HMDB51 RGB frame folders for temporal-shift-module: data/HMDB51/images/<video>/img_NNNNN.jpg and
    data/HMDB51/splits/hmdb51_rgb_{train,val}_split_1.txt ("<video> <num_frames> <label>" per line).
    The repository hard-codes its data root (ops/dataset_config.py: ROOT_DATASET = '/ssd/video/'): this
    step points that one constant at ./data/ in the scratch copy it runs in (no other line changes)."""
    from PIL import Image
    cfg = os.path.join("ops", "dataset_config.py")
    src = open(cfg).read()
    new = re.sub(r"^ROOT_DATASET = .*$", "ROOT_DATASET = 'data/'", src, count=1, flags=re.M)
    assert new != src, "ROOT_DATASET line not found"
    open(cfg, "w").write(new)
    root = os.path.join("data", "HMDB51")
    os.makedirs(os.path.join(root, "splits"), exist_ok=True)
    s, nf, nc = int(side), int(frames), int(classes)
    for split, n in (("train", int(ntrain)), ("val", int(nval))):
        r = rng("tsm/" + split)
        with open(os.path.join(root, "splits", "hmdb51_rgb_%s_split_1.txt" % split), "w") as f:
            for v in range(n):
                name = "%s_v%03d" % (split, v)
                d = os.path.join(root, "images", name)
                os.makedirs(d, exist_ok=True)
                base = r.randint(0, 256, size=(s, s + nf, 3))
                for i in range(nf):
                    Image.fromarray(base[:, i:i + s].astype("uint8")).save(
                        os.path.join(d, "img_%05d.jpg" % (i + 1)), quality=95)
                f.write("%s %d %d\n" % (name, nf, r.randint(0, nc)))


def tsm_compat():
    """ops/utils.py accuracy(): `correct[:k].view(-1)` on the transpose of topk's indices raises on current
    torch ("view size is not compatible"); that one call becomes `.reshape(-1)` (same values) in the
    scratch copy, as for CutMix-PyTorch in the thirteenth session. Nothing dp2ddp reads or writes changes."""
    p = os.path.join("ops", "utils.py")
    src = open(p).read()
    new = src.replace("correct[:k].view(-1)", "correct[:k].reshape(-1)")
    assert new != src, "accuracy() line not found"
    open(p, "w").write(new)


def kit(*args):
    """run one step of kit.py (beside this file) with this python."""
    import subprocess
    subprocess.check_call([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "kit.py"), *args])


def pip(*packages):
    """pip-install into this python whatever of PACKAGES is absent (pip names; importability not checked)."""
    import subprocess
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *packages])


if __name__ == "__main__":
    # steps joined by a lone '+' (a recipe's setup is split on spaces, not run by a shell)
    argv, step = sys.argv[1:], []
    for a in argv + ["+"]:
        if a == "+":
            if step:
                globals()[step[0].replace("-", "_")](*step[1:])
            step = []
        else:
            step.append(a)
