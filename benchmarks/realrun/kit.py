"""Setup steps for the real-repository recipes (recipes.tsv): small, our own, run in a recipe's workdir.

    python kit.py STEP ARGS... [+ STEP ARGS...]...

Steps (joined by a lone '+', since a recipe's setup field is split on spaces, not run by a shell):
  pip PKG...                   pip-install into this python the packages that do not import yet
                               (e.g. tensorboard for torch.utils.tensorboard, absent from the
                               harness's venv)
  jsonset SRC DST KEY=VAL...   copy a JSON/YAML config with some keys changed (dotted keys walk
                               into mappings and list indices; VAL parsed as JSON when it parses)
  images DIR N SIDE [EXT]      write N small deterministic RGB images DIR/img_00000.EXT ... (png)
  masks DIR N SIDE CLASSES     write N deterministic label images DIR/img_00000.png ... (mode P,
                               values < CLASSES)
  lines FILE N                 write the N names img_00000 ... one a line (an image-list file)
  text DIR                     write a tiny word-level corpus DIR/{train,valid,test}.txt
  cifar-c DIR N SCRIPT VAR     write CIFAR-10-C-like arrays: DIR/<name>.npy (N 32x32x3 uint8 images)
                               for each name in the list literal VAR of SCRIPT, and DIR/labels.npy
  celeba DIR N SIDE            write N RGB PNGs and a CelebA-style list_attr_celeba.txt (40 +-1
                               attributes a line) into DIR
  ocr-lmdb DIR N               write an LMDB of N word images (100x32 PNG) with lower-case labels, keys
                               num-samples / image-%09d / label-%09d from 1 (needs lmdb: pip it first)
  run SCRIPT ARGS...           run SCRIPT with this python (e.g. a first training run to resume)
  newest-dir GLOB DST          copy the folder of the newest file matching GLOB to DST (a checkpoint
                               saved under a folder named by the clock, with its config beside it)
"""
import json
import os
import subprocess
import sys
import zlib


def _parse(value):
    try:
        return json.loads(value)
    except ValueError:
        return value


def _load_config(path):
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)


def set_key(config, dotted, value):
    keys = dotted.split(".")
    node = config
    for key in keys[:-1]:
        node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
    last = keys[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def step_jsonset(src, dst, *pairs):
    config = _load_config(src)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit("kit jsonset: %s: expected key=value" % pair)
        set_key(config, key, _parse(value))
    with open(dst, "w") as f:
        if dst.endswith((".yaml", ".yml")):
            import yaml

            yaml.safe_dump(config, f, sort_keys=False)
        else:
            json.dump(config, f, indent=2)


def step_pip(*packages):
    import importlib.util

    module_of = {"pyyaml": "yaml", "pillow": "PIL", "opencv-python-headless": "cv2", "scikit-image": "skimage", "scikit-learn": "sklearn"}
    missing = [p for p in packages
               if importlib.util.find_spec(module_of.get(p.lower(), p.replace("-", "_"))) is None]
    if missing:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *missing])


def _rng(tag):
    import numpy as np

    return np.random.RandomState(zlib.crc32(tag.encode()) & 0x7FFFFFFF)


def step_images(folder, n, side, ext="png"):
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    rng = _rng("images/" + folder)
    for i in range(int(n)):
        a = rng.randint(0, 256, size=(int(side), int(side), 3)).astype("uint8")
        Image.fromarray(a).save(os.path.join(folder, "img_%05d.%s" % (i, ext)))


def step_masks(folder, n, side, classes):
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    rng = _rng("masks/" + folder)
    for i in range(int(n)):
        a = rng.randint(0, int(classes), size=(int(side), int(side))).astype("uint8")
        Image.fromarray(a, mode="L").convert("P").save(os.path.join(folder, "img_%05d.png" % i))


def step_lines(path, n):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        for i in range(int(n)):
            f.write("img_%05d\n" % i)


def step_text(folder):
    os.makedirs(folder, exist_ok=True)
    rng = _rng("text/" + folder)
    vocab = ["w%d" % i for i in range(50)]
    for split, n in (("train", 400), ("valid", 60), ("test", 60)):
        with open(os.path.join(folder, split + ".txt"), "w") as f:
            for _ in range(n):
                f.write(" " + " ".join(vocab[j] for j in rng.randint(0, len(vocab), size=rng.randint(4, 12))) + " \n")


def step_cifar_c(folder, n, script, var):
    import ast

    import numpy as np

    names = None
    for node in ast.walk(ast.parse(open(script).read())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == var for t in node.targets):
            names = ast.literal_eval(node.value)
    if not names:
        raise SystemExit("kit cifar-c: no list %s in %s" % (var, script))
    os.makedirs(folder, exist_ok=True)
    rng = _rng("cifar-c/" + folder)
    np.save(os.path.join(folder, "labels.npy"), rng.randint(0, 10, size=int(n)).astype(np.int64))
    for name in names:
        np.save(os.path.join(folder, name + ".npy"), rng.randint(0, 256, size=(int(n), 32, 32, 3)).astype(np.uint8))


def step_celeba(folder, n, side):
    step_images(folder, n, side)
    rng = _rng("celeba/" + folder)
    names = ["attr_%02d" % j for j in range(40)]
    with open(os.path.join(folder, "list_attr_celeba.txt"), "w") as f:
        f.write("%d\n%s\n" % (int(n), " ".join(names)))
        for i in range(int(n)):
            f.write("img_%05d.png %s\n" % (i, " ".join("1" if b else "-1" for b in rng.randint(0, 2, size=40))))


def step_ocr_lmdb(folder, n):
    import io

    import lmdb
    from PIL import Image

    os.makedirs(folder, exist_ok=True)
    rng = _rng("ocr/" + folder)
    chars = "0123456789abcdefghijklmnopqrstuvwxyz"
    env = lmdb.open(folder, map_size=1 << 26)
    with env.begin(write=True) as txn:
        for i in range(1, int(n) + 1):
            buf = io.BytesIO()
            Image.fromarray(rng.randint(0, 256, size=(32, 100, 3)).astype("uint8")).save(buf, format="PNG")
            label = "".join(chars[j] for j in rng.randint(0, len(chars), size=rng.randint(3, 7)))
            txn.put(b"image-%09d" % i, buf.getvalue())
            txn.put(b"label-%09d" % i, label.encode())
        txn.put(b"num-samples", str(int(n)).encode())
    env.close()


def step_run(script, *args):
    subprocess.check_call([sys.executable, script, *args])


def step_newest_dir(pattern, dst):
    """Copy the folder of the newest file matching ``pattern`` (a glob) to ``dst``: a
    checkpoint saved under a folder named by the clock, with the config beside it."""
    import glob
    import shutil

    found = sorted(glob.glob(pattern, recursive=True), key=os.path.getmtime)
    if not found:
        raise SystemExit(f"newest-dir: nothing matches {pattern}")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(os.path.dirname(found[-1]), dst)


STEPS = {"jsonset": step_jsonset, "pip": step_pip, "images": step_images, "masks": step_masks,
         "lines": step_lines, "text": step_text, "cifar-c": step_cifar_c, "celeba": step_celeba, "ocr-lmdb": step_ocr_lmdb, "run": step_run,
         "newest-dir": step_newest_dir}


def main(argv):
    groups, cur = [], []
    for a in argv:
        if a == "+":
            groups.append(cur)
            cur = []
        else:
            cur.append(a)
    groups.append(cur)
    for g in groups:
        if not g or g[0] not in STEPS:
            print("kit: unknown step %r (steps: %s)" % (g[0] if g else "", ", ".join(sorted(STEPS))))
            return 2
        STEPS[g[0]](*g[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
