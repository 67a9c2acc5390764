"""Tiny deterministic setup steps for recipes-sample16.tsv (semseg, BERT-NER; our own code): python mk16b.py STEP [ARGS] [+ STEP ARGS]...

Steps run in the recipe's workdir (a scratch copy of the repository), never in the snapshot."""
import json
import os
import re
import sys
import zlib

import numpy as np


def rng(tag):
    return np.random.RandomState(zlib.crc32(tag.encode()) & 0x7FFFFFFF)


# ----------------------------------------------------------------------------- pytorch-semseg
def semseg(ntrain="8", nval="4", side="64", classes="65", arch="frrnA", iters="6", bs="4", val="3",
           size_average="False", group_norm="True", lr="1.0e-7"):
    """Mapillary Vistas layout for meetps/pytorch-semseg (ptsemseg/loader/mapillary_vistas_loader.py,
    the one loader that reads with PIL only; the others call scipy.misc.imread/imresize, gone from
    current scipy): data/vistas/config.json ({"labels": [{"readable", "color"}] * 65}),
    data/vistas/{training,validation}/images/NAME.jpg + labels/NAME.png (mode L, values 0..64; 65 is
    the loader's ignore value, mapped to 250 = cross_entropy2d's ignore_index). Writes
    configs/rr64_<arch>_vistas.yml: SGD, cross_entropy (size_average as the shipped fcn8s_pascal.yml:
    False, a summed loss, hence the small lr), `iters` iterations of batch `bs`, validation every `val` iterations and at
    the last one (so a *_best_model.pkl is written), no resume, n_workers 0."""
    from PIL import Image
    s, nc = int(side), int(classes)
    root = os.path.join("data", "vistas")
    os.makedirs(root, exist_ok=True)
    r = rng("semseg/config")
    labels = [{"readable": "class_%02d" % i, "color": [int(c) for c in r.randint(0, 256, 3)]} for i in range(nc)]
    json.dump({"labels": labels}, open(os.path.join(root, "config.json"), "w"))
    for split, n in (("training", int(ntrain)), ("validation", int(nval))):
        os.makedirs(os.path.join(root, split, "images"), exist_ok=True)
        os.makedirs(os.path.join(root, split, "labels"), exist_ok=True)
        r = rng("semseg/" + split)
        for k in range(n):
            name = "%s_%03d" % (split, k)
            img = r.randint(0, 256, size=(s, s, 3)).astype("uint8")
            # blocky labels (a few classes per image) so the nearest/bicubic resize keeps them ints
            lbl = np.kron(r.randint(0, 8, size=(s // 8, s // 8)), np.ones((8, 8), dtype=int)).astype("uint8")
            Image.fromarray(img).save(os.path.join(root, split, "images", name + ".jpg"), quality=95)
            Image.fromarray(lbl, mode="L").save(os.path.join(root, split, "labels", name + ".png"))
    cfg = """model:
    arch: %s
    group_norm: %s
data:
    dataset: vistas
    train_split: training
    val_split: validation
    img_rows: %d
    img_cols: %d
    path: data/vistas
training:
    train_iters: %d
    batch_size: %d
    val_interval: %d
    n_workers: 0
    print_interval: 1
    optimizer:
        name: 'sgd'
        lr: %s
        weight_decay: 0.0005
        momentum: 0.9
    loss:
        name: 'cross_entropy'
        size_average: %s
    lr_schedule:
    resume:
""" % (arch, group_norm, s, s, int(iters), int(bs), int(val), lr, size_average)
    os.makedirs("configs", exist_ok=True)
    open(os.path.join("configs", "rr64_%s_vistas.yml" % arch), "w").write(cfg)


def semseg_compat():
    """train.py and validate.py call yaml.load(fp) with no Loader, a TypeError on PyYAML >= 6: that one
    call becomes yaml.load(fp, Loader=yaml.SafeLoader) (the same dict for these configs) in the scratch
    copy. Nothing dp2ddp reads or writes changes."""
    for p in ("train.py", "validate.py"):
        src = open(p).read()
        new = src.replace("cfg = yaml.load(fp)", "cfg = yaml.load(fp, Loader=yaml.SafeLoader)")
        assert new != src, "yaml.load line not found in " + p
        open(p, "w").write(new)


# ----------------------------------------------------------------------------- BERT-NER
WORDS = ("john smith mary jones paris london berlin acme corp google united nations visited met the in "
         "at of and a to from with said on for today yesterday company city river bank old new big small "
         "german french english cup league").split()
TAG = {"john": "PER", "smith": "PER", "mary": "PER", "jones": "PER", "paris": "LOC", "london": "LOC",
       "berlin": "LOC", "acme": "ORG", "corp": "ORG", "google": "ORG", "united": "ORG", "nations": "ORG",
       "german": "MISC", "french": "MISC", "english": "MISC", "cup": "MISC", "league": "MISC"}


def bert_tiny(out="tiny-bert", hidden="32", layers="2", heads="2"):
    """A tiny random BERT in the directory layout pytorch_transformers 1.2.0's from_pretrained reads:
    config.json, pytorch_model.bin (a BertModel state_dict, seed 0), vocab.txt (lower-case words,
    the special tokens and a few '##' pieces)."""
    import torch
    from pytorch_transformers import BertConfig, BertModel
    os.makedirs(out, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [".", ",", "##s", "##ed", "##ing"]
    open(os.path.join(out, "vocab.txt"), "w").write("\n".join(vocab) + "\n")
    cfg = BertConfig(vocab_size_or_config_json_file=len(vocab), hidden_size=int(hidden),
                     num_hidden_layers=int(layers), num_attention_heads=int(heads),
                     intermediate_size=4 * int(hidden), max_position_embeddings=64, type_vocab_size=2)
    torch.manual_seed(0)
    BertModel(cfg).save_pretrained(out)


def bert_data(out="conll", ntrain="16", nvalid="8", ntest="8"):
    """CoNLL-2003-style files (word POS chunk TAG per line, blank line between sentences, -DOCSTART-
    first) with the labels NerProcessor.get_labels() knows (O, B-/I- PER ORG LOC MISC)."""
    os.makedirs(out, exist_ok=True)
    for split, n in (("train", int(ntrain)), ("valid", int(nvalid)), ("test", int(ntest))):
        r = rng("bert/" + split)
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            prev = None
            for w in r.choice(WORDS, size=r.randint(4, 10)):
                t = TAG.get(w)
                lab = "O" if t is None else ("I-" if prev == t else "B-") + t
                prev = t
                lines.append("%s NN B-NP %s" % (w.capitalize() if t else w, lab))
            lines.append(". . O O")
            lines.append("")
        open(os.path.join(out, split + ".txt"), "w").write("\n".join(lines) + "\n")


def bert_compat():
    """Ner.forward builds its buffer with device='cuda' (torch.zeros(..., device='cuda')), which fails
    on a machine without CUDA (the shim only makes .cuda() a no-op): that one argument becomes
    device=sequence_output.device (the same device on a GPU) in the scratch copy of run_ner.py."""
    p = "run_ner.py"
    src = open(p).read()
    new = src.replace("dtype=torch.float32,device='cuda')", "dtype=torch.float32,device=sequence_output.device)")
    assert new != src, "device='cuda' line not found"
    open(p, "w").write(new)


def pip(*packages):
    """pip-install PACKAGES into this python (pip names), e.g. pytorch-transformers==1.2.0 seqeval for
    BERT-NER (not in the realrun venv's common requirements)."""
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
