"""One gloo rank of tests/sources/test_footer_share.py: ``python footer_share_child.py INIT RANK WORLD URL OPTIONS OUT``.

Opens the dataset at ``URL`` (footers shared between the ranks through the process group's
store), iterates epoch 0 and saves the window starts it got, and every rank's batch count from
``stats(all_ranks=True)``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist


def main(init: str, rank: int, world: int, url: str, options: str, out: str) -> None:
    from dask_windows.dataset import WindowDataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    kw = dict(features=["f0", "f1"], targets=["y"], series="sid", window=8, stride=2, batch_size=16)
    ds = WindowDataset(url, storage_options=json.loads(options), return_index=True, **kw)
    ds.set_epoch(0)
    starts = [batch[-1].numpy() for batch in torch.utils.data.DataLoader(ds, batch_size=None)]
    stats = ds.stats(all_ranks=True)  # a collective: every rank's figures, the slowest named
    np.save(out, np.concatenate(starts))
    with open(out + ".json", "w") as dst:
        json.dump({"ranks": [s.batches for s in stats.ranks], "slowest": stats.slowest_rank, "len": len(ds)}, dst)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads can abort the interpreter's shutdown (see tests/mixture_child.py)
