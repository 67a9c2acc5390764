"""Write a seeded torchvision model's state_dict where `pretrained=True` looks for it (no network).

    python mktvweights.py TORCH_HOME ARCH [WEIGHTS_ENUM]

e.g. `python mktvweights.py th resnet50` writes th/hub/checkpoints/resnet50-0676ba61.pth, the file
`torchvision.models.resnet50(pretrained=True)` loads when TORCH_HOME=th (a file already in the
cache is loaded without a download or a hash check). The weights are a fixed-seed initialisation,
standing in for the ImageNet ones: the survey compares runs, not accuracies.
"""
import os
import sys

import torch
import torchvision


def main(home, arch, enum_name=None):
    models = torchvision.models
    enum_name = enum_name or models.get_model_weights(arch).__name__
    enum = getattr(models, enum_name)
    # `pretrained=True` means the first ImageNet weights (IMAGENET1K_V1), not DEFAULT
    weights = getattr(enum, "IMAGENET1K_V1", enum.DEFAULT)
    torch.manual_seed(0)
    model = getattr(models, arch)(weights=None)
    folder = os.path.join(home, "hub", "checkpoints")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, os.path.basename(weights.url))
    torch.save(model.state_dict(), path)
    print("wrote", path)


if __name__ == "__main__":
    main(*sys.argv[1:])
