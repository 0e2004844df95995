"""One gloo rank of tests/test_mixture.py: ``python mixture_child.py INIT RANK OUT``.

Iterates mixture epoch 1 through a DataLoader with 2 workers, in step with the other rank,
and saves the member label and window index of every window it got.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from test_mixture import make, member


def main(init: str, rank: int, out: str) -> None:
    torch.set_num_threads(1)
    mixture = make({"small": member("small", 7), "medium": member("medium", 16), "large": member("large", 50)})
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    mixture.set_epoch(1)
    labels, indices = [], []
    for _x, index, label in torch.utils.data.DataLoader(mixture, batch_size=None, num_workers=2):
        dist.all_reduce(torch.ones(1))  # a rank with fewer batches would hang the other here
        labels.append(label.numpy())
        indices.append(index.numpy())
    np.savez(out, batches=len(labels), label=np.concatenate(labels), index=np.concatenate(indices))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
    # gloo's threads can abort the interpreter's shutdown even after a clean destroy_process_group
    # (see examples/ddp_train.py); the results are written, so leave without finalisation.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
