"""Child processes of the scale-out tests: ``python scale_child.py {resume,ddp} '<json args>'``.

``resume`` opens a fresh dataset for each saved state, resumes it and stores what it yields.
``ddp`` is one rank of a gloo group iterating DataLoaders and storing the window indices it got.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from scale_helpers import drain, open_dataset, save_batches


def resume(args: dict) -> None:
    """Resume each job's state in a fresh dataset and save the rest of the epoch."""
    from torch.utils.data import DataLoader

    for job in args["jobs"]:
        ds = open_dataset(args["data"], job["log"], **args["dataset"])
        saved = torch.load(job["state"], weights_only=True)
        if job["loader"] == "stateful":
            from torchdata.stateful_dataloader import StatefulDataLoader

            ds.set_epoch(saved["epoch"])
            loader = StatefulDataLoader(ds, batch_size=None, num_workers=job["num_workers"])
            loader.load_state_dict(saved["loader"])
        else:
            ds.load_state_dict(saved["data"])
            ds.set_epoch(saved["epoch"])  # what a training loop does; keeps the resume of that epoch
            loader = DataLoader(ds, batch_size=None, num_workers=job["num_workers"])
        save_batches(job["out"], drain(loader))


def ddp(args: dict) -> None:
    """One rank: per config, iterate a DataLoader in step with the other ranks and save indices."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    # Opened before the process group exists: rank and world size are detected lazily.
    datasets = [open_dataset(args["data"], **c["dataset"]) for c in args["configs"]]
    dist.init_process_group("gloo", init_method=args["init"], rank=args["rank"], world_size=args["world_size"])
    out = {}
    for n, (config, ds) in enumerate(zip(args["configs"], datasets)):
        if config["epoch"] is not None:  # None: not even set_epoch looks the ranks up before the workers start
            ds.set_epoch(config["epoch"])
        context = config.get("context")  # "spawn": workers get a pickled copy and cannot detect the ranks
        loader = DataLoader(ds, batch_size=None, num_workers=config["num_workers"], multiprocessing_context=context)
        indices = []
        for x, idx in loader:
            assert torch.equal(x[:, 0, 0], idx.to(torch.float32)), "a window's values do not match its index"
            dist.all_reduce(torch.ones(1))  # a rank with fewer batches would hang the others here
            indices.append(idx.numpy())
        out[f"len{n}"] = np.array(len(ds))
        out[f"sizes{n}"] = np.array([len(i) for i in indices], dtype=np.int64)
        out[f"idx{n}"] = np.concatenate(indices) if indices else np.zeros(0, np.int64)
        dist.barrier()
    np.savez(args["out"], **out)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    {"resume": resume, "ddp": ddp}[sys.argv[1]](json.loads(sys.argv[2]))
    # gloo's threads can abort the interpreter's shutdown even after a clean destroy_process_group
    # (see examples/ddp_train.py); the results are written, so leave without finalisation.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
