"""Tiny deterministic setup steps of recipes-sample13.tsv (our own code): python mk13.py STEP [ARGS]."""
import os
import sys

import numpy as np


def rng(tag):
    import zlib
    return np.random.RandomState(zlib.crc32(tag.encode()) & 0x7FFFFFFF)


def dgcnn(ntrain="16", ntest="8", npts="128"):
    """data/modelnet40_ply_hdf5_2048/ply_data_{train,test}0.h5 (data (N,P,3) float32, label (N,1))."""
    import h5py
    d = os.path.join("data", "modelnet40_ply_hdf5_2048")
    os.makedirs(d, exist_ok=True)
    for part, n in (("train", int(ntrain)), ("test", int(ntest))):
        r = rng("dgcnn/" + part)
        with h5py.File(os.path.join(d, "ply_data_%s0.h5" % part), "w") as f:
            f["data"] = r.uniform(-1, 1, size=(n, int(npts), 3)).astype("float32")
            f["label"] = r.randint(0, 40, size=(n, 1)).astype("uint8")


def sfm(root="sfmdata", side="128", ntrain="2"):
    """root/{train,val}.txt and scene folders of JPEGs with cam.txt (SequenceFolder layout)."""
    from PIL import Image
    s = int(side)
    scenes = {"train": [("s%d" % i, 4) for i in range(int(ntrain))], "val": [("v0", 6)]}
    os.makedirs(root, exist_ok=True)
    for split, lst in scenes.items():
        with open(os.path.join(root, split + ".txt"), "w") as f:
            for name, n in lst:
                f.write(name + "\n")
                sd = os.path.join(root, name)
                os.makedirs(sd, exist_ok=True)
                r = rng("sfm/" + name)
                base = r.randint(0, 256, size=(s, s + 8, 3))
                for i in range(n):
                    a = base[:, i:i + s].astype("uint8")
                    Image.fromarray(a).save(os.path.join(sd, "%07d.jpg" % i), quality=95)
                with open(os.path.join(sd, "cam.txt"), "w") as c:
                    c.write("%f 0 %f\n0 %f %f\n0 0 1\n" % (s, s / 2, s, s / 2))


def transunet(n="8", side="32"):
    """../data/Synapse/train_npz/<slice>.npz for the first n slices of lists/lists_Synapse/train.txt
    (the list is cut to those n), and ../model/vit_checkpoint/imagenet21k/ViT-B_16.npz: the
    seeded ViT-B/16 weights in the layout VisionTransformer.load_from reads."""
    import torch
    n, s = int(n), int(side)
    lst = os.path.join("lists", "lists_Synapse", "train.txt")
    names = [l.strip() for l in open(lst)][:n]
    with open(lst, "w") as f:
        f.write("\n".join(names) + "\n")
    d = os.path.join("..", "data", "Synapse", "train_npz")
    os.makedirs(d, exist_ok=True)
    for name in names:
        r = rng("tu/" + name)
        np.savez(os.path.join(d, name + ".npz"), image=r.rand(s, s).astype("float32"),
                 label=r.randint(0, 9, size=(s, s)).astype("float32"))
    sys.path.insert(0, ".")
    from networks.vit_seg_modeling import CONFIGS, VisionTransformer
    cfg = CONFIGS["ViT-B_16"]
    cfg.n_classes = 9
    cfg.n_skip = 0
    torch.manual_seed(0)
    m = VisionTransformer(cfg, img_size=s, num_classes=9)
    t = m.transformer
    w = {}
    w["embedding/kernel"] = t.embeddings.patch_embeddings.weight.detach().permute(2, 3, 1, 0).numpy()
    w["embedding/bias"] = t.embeddings.patch_embeddings.bias.detach().numpy()
    w["Transformer/encoder_norm/scale"] = t.encoder.encoder_norm.weight.detach().numpy()
    w["Transformer/encoder_norm/bias"] = t.encoder.encoder_norm.bias.detach().numpy()
    pe = t.embeddings.position_embeddings.detach()
    w["Transformer/posembed_input/pos_embedding"] = torch.cat([pe[:, :1], pe], 1).numpy()
    for i, blk in enumerate(t.encoder.layer):
        R = "Transformer/encoderblock_%d/" % i
        for key, lin in (("MultiHeadDotProductAttention_1/query", blk.attn.query),
                         ("MultiHeadDotProductAttention_1/key", blk.attn.key),
                         ("MultiHeadDotProductAttention_1/value", blk.attn.value),
                         ("MultiHeadDotProductAttention_1/out", blk.attn.out),
                         ("MlpBlock_3/Dense_0", blk.ffn.fc1), ("MlpBlock_3/Dense_1", blk.ffn.fc2)):
            w[R + key + "/kernel"] = lin.weight.detach().t().numpy()
            w[R + key + "/bias"] = lin.bias.detach().numpy()
        for key, ln in (("LayerNorm_0", blk.attention_norm), ("LayerNorm_2", blk.ffn_norm)):
            w[R + key + "/scale"] = ln.weight.detach().numpy()
            w[R + key + "/bias"] = ln.bias.detach().numpy()
    md = os.path.join("..", "model", "vit_checkpoint", "imagenet21k")
    os.makedirs(md, exist_ok=True)
    np.savez(os.path.join(md, "ViT-B_16.npz"), **w)


def fsl(ntrain="16", nval="8", ntest="80", side="84"):
    """materials/mini-imagenet/miniImageNet_category_split_{train_phase_train,train_phase_val,test}.pickle
    and a tiny classifier config tiny.yaml (convnet4, 2 epochs, batch 8, no few-shot evaluation)."""
    import pickle
    d = os.path.join("materials", "mini-imagenet")
    os.makedirs(d, exist_ok=True)
    for split, n, k in (("train_phase_train", int(ntrain), 4), ("train_phase_val", int(nval), 4),
                        ("test", int(ntest), 5)):
        r = rng("fsl/" + split)
        pack = {"data": r.randint(0, 256, size=(n, int(side), int(side), 3)).astype("uint8"),
                "labels": [i % k for i in range(n)]}
        with open(os.path.join(d, "miniImageNet_category_split_%s.pickle" % split), "wb") as f:
            pickle.dump(pack, f)
    with open("tiny.yaml", "w") as f:
        f.write("""train_dataset: mini-imagenet
train_dataset_args: {split: train, augment: resize}
val_dataset: mini-imagenet
val_dataset_args: {split: train_phase_val}
fs_dataset: mini-imagenet
fs_dataset_args: {split: test}
eval_fs_epoch: 1000

model: classifier
model_args:
    encoder: convnet4
    encoder_args: {}
    classifier: linear-classifier
    classifier_args: {n_classes: 4}

batch_size: 8
max_epoch: 2
optimizer: sgd
optimizer_args: {lr: 0.01, weight_decay: 5.e-4, milestones: [1]}

save_epoch: 1
visualize_datasets: false
""")


def simsiam_ckpt(config, out):
    """A SimSiam checkpoint {'state_dict': model.state_dict()} of the config's model, seeded, for
    linear_eval.py --eval_from (main.py saves {'epoch', 'state_dict': model.module.state_dict()})."""
    import torch
    import yaml
    sys.path.insert(0, ".")
    from arguments import Namespace
    from models import get_model
    cfg = Namespace(yaml.safe_load(open(config)))
    torch.manual_seed(0)
    m = get_model(cfg.model)
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    torch.save({"epoch": 0, "state_dict": m.state_dict()}, out)


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
