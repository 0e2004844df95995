"""One gloo rank of tests/planning/test_elastic.py: ``python elastic_child.py '<json args>'``.

``phase == "stop"``: iterate epoch 1 through a DataLoader, stop after ``taken`` batches and (rank 0)
save the state. ``phase == "resume"``: load that state and run the rest of the epoch. Every rank
saves the window indices it got.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from scale_helpers import open_dataset


def main(args: dict) -> None:
    torch.set_num_threads(1)
    ds = open_dataset(args["data"], **args["dataset"])
    dist.init_process_group("gloo", init_method=args["init"], rank=args["rank"], world_size=args["world_size"])
    if args["phase"] == "resume":
        ds.load_state_dict(torch.load(args["state"], weights_only=True))
    ds.set_epoch(1)
    got = []
    for x, index in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args["num_workers"]):
        assert torch.equal(x[:, 0, 0], index.to(torch.float32))
        dist.all_reduce(torch.ones(1))  # a rank with fewer batches would hang the others here
        got.append(index.numpy())
        if len(got) == args.get("taken"):
            break
    if args["phase"] == "stop" and args["rank"] == 0:
        torch.save(ds.state_dict(batches=len(got), num_workers=args["num_workers"]), args["state"])
    np.savez(args["out"], batches=len(got), index=np.concatenate(got) if got else np.zeros(0, np.int64))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    # gloo's threads can abort the interpreter's shutdown even after a clean destroy_process_group
    # (see examples/ddp_train.py); the results are written, so leave without finalisation.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
