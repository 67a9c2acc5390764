"""Write a small pseudo-labelled auxiliary set as a pickle: {'data': uint8 N x 32 x 32 x 3,
'extrapolated_targets': int64 N} (the layout of the 500K Tiny Images file of semi-supervised
CIFAR training, e.g. ti_500K_pseudo_labeled.pickle), deterministic.

    python mkauxpickle.py PATH N [CLASSES]
"""
import os
import pickle
import sys

import numpy as np


def main(path, n, classes=10):
    rng = np.random.RandomState(1234)
    n, classes = int(n), int(classes)
    aux = {"data": rng.randint(0, 256, size=(n, 32, 32, 3)).astype(np.uint8),
           "extrapolated_targets": rng.randint(0, classes, size=n).astype(np.int64)}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(aux, f)
    print("wrote", path)


if __name__ == "__main__":
    main(*sys.argv[1:])
