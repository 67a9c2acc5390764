"""mkwrn.py OUT LAYERS WIDEN CLASSES: save the state_dict of models.wrn.WideResNet(LAYERS, CLASSES, WIDEN)
(imported from the current folder), seeded, as the 'pre-trained' checkpoint a fine-tuning script loads."""
import os
import sys

import torch

sys.path.insert(0, os.getcwd())
from models.wrn import WideResNet  # noqa: E402

out, layers, widen, classes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
torch.save(WideResNet(layers, classes, widen).state_dict(), out)
print("wrote", out)
