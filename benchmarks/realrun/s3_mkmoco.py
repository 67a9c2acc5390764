"""s3_mkmoco.py ARCH OUT: a seeded stand-in for a MoCo pre-training checkpoint, for a linear-classification
script that loads one (e.g. CheSS upstream/main_lincls.py --pretrained OUT).

Writes {'epoch': 1, 'arch': ARCH, 'state_dict': {...}} whose keys are torchvision's ARCH state_dict keys under
'module.encoder_q.' (the query encoder of a DataParallel-wrapped MoCo model, fc included) and the same under
'module.encoder_k.', with seeded random values (torch.manual_seed(0)).
"""
import sys

import torch
import torchvision.models as models


def main(arch, out):
    torch.manual_seed(0)
    net = getattr(models, arch)()
    sd = {}
    for prefix in ("module.encoder_q.", "module.encoder_k."):
        for k, v in net.state_dict().items():
            sd[prefix + k] = v.clone()
    torch.save({"epoch": 1, "arch": arch, "state_dict": sd}, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
