"""s3_chessdata.py DIR N SIDE CLASSES: small deterministic multi-label image data in the layout of CheSS's
downstream classifier (downstream/classification/datasets.py DiseaseDataset):

  DIR/img_00000.png ...              N RGB PNGs, SIDE pixels a side
  DIR/train.json, val.json, test.json  {"imgs": [paths], "labels": [[0./1.] * CLASSES, ...]} (all N images each)
  DIR/labels.csv                     a CSV whose columns 5.. are the CLASSES class names (its --csv_file)
"""
import json
import os
import sys
import zlib

import numpy as np
from PIL import Image


def main(folder, n, side, classes):
    n, side, classes = int(n), int(side), int(classes)
    os.makedirs(folder, exist_ok=True)
    rng = np.random.RandomState(zlib.crc32(("chess/" + folder).encode()) & 0x7FFFFFFF)
    paths = []
    for i in range(n):
        a = rng.randint(0, 256, size=(side, side, 3)).astype("uint8")
        p = os.path.join(folder, "img_%05d.png" % i)
        Image.fromarray(a).save(p)
        paths.append(p)
    labels = rng.randint(0, 2, size=(n, classes)).astype(float).tolist()
    for split in ("train", "val", "test"):
        with open(os.path.join(folder, split + ".json"), "w") as f:
            json.dump({"imgs": paths, "labels": labels}, f)
    names = ["class_%d" % c for c in range(classes)]
    with open(os.path.join(folder, "labels.csv"), "w") as f:
        f.write(",".join(["path", "sex", "age", "view", "ap_pa"] + names) + "\n")
        for i, p in enumerate(paths):
            f.write(",".join([p, "M", "50", "Frontal", "PA"] + ["%d" % v for v in labels[i]]) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:5])
