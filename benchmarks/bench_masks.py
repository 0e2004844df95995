"""Time per mask of dask_windows.ondevice.masks against tsai and ``torch.rand(...) < r``.

Usage::

    pip install tsai==1.0.1 --no-deps   # optional: adds tsai's create_subsequence_mask
    python benchmarks/bench_masks.py [--repeats 200] [--device cpu]

tsai's MVP module imports fastai and torchvision; only the one function is
needed, so it is read from the installed file and run with its own imports
(torch, random, Geometric, Binomial) without importing the package. Timings
use one thread (``torch.set_num_threads(1)``) and report the median time per
call over blocks of ``--block`` consecutive calls, after a warm-up; blocks of
all candidates alternate so that load from other processes hits them alike.
``--block 1`` times every call between calls of the other candidates, with
colder caches, closer to a mask made once per training step. On the CPU the
clock is the thread's CPU time (``--clock cpu``, the default there), so that
time slices lost to other processes on a shared machine do not count;
``--clock wall`` times by the wall clock (always used on CUDA).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import pathlib
import random
import statistics
import time
from collections.abc import Callable

import torch
from torch.distributions.binomial import Binomial
from torch.distributions.geometric import Geometric

from dask_windows.ondevice import masks

SHAPES = [(256, 4, 512), (64, 64, 1024)]


def load_tsai_subsequence_mask() -> Callable[..., torch.Tensor] | None:
    """tsai's ``create_subsequence_mask``, read from the installed package file, or None."""
    spec = importlib.util.find_spec("tsai")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(spec.submodule_search_locations[0]) / "callback" / "MVP.py"
    if not path.exists():
        return None
    tree = ast.parse(path.read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    found = [node for node in functions if node.name == "create_subsequence_mask"]
    if not found:
        return None
    namespace = {"torch": torch, "random": random, "Geometric": Geometric, "Binomial": Binomial}
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["create_subsequence_mask"]


def candidates(tsai_mask: Callable[..., torch.Tensor] | None, r: float, lm: float) -> dict[str, Callable]:
    generator_for: dict[torch.device, torch.Generator] = {}

    def gen(x: torch.Tensor) -> torch.Generator:
        if x.device not in generator_for:
            generator_for[x.device] = torch.Generator(device=x.device).manual_seed(0)
        return generator_for[x.device]

    table: dict[str, Callable] = {
        "torch.rand(...) < r": lambda x: torch.rand(x.shape, device=x.device, generator=gen(x)) < r,
    }
    if tsai_mask is not None:
        table["tsai create_subsequence_mask (stateful)"] = lambda x: tsai_mask(x, r=r, lm=lm)
        table["tsai create_subsequence_mask (sync)"] = lambda x: tsai_mask(x, r=r, lm=lm, sync=True)
    table.update(
        {
            "random_mask": lambda x: masks.random_mask(x, r, generator=gen(x)),
            "subsequence_mask (stateful)": lambda x: masks.subsequence_mask(x, r, lm, generator=gen(x)),
            "subsequence_mask (sync)": lambda x: masks.subsequence_mask(x, r, lm, sync=True, generator=gen(x)),
            "subsequence_mask (stateful=False)": lambda x: masks.subsequence_mask(
                x, r, lm, stateful=False, generator=gen(x)
            ),
            "variable_mask": lambda x: masks.variable_mask(x, r, generator=gen(x)),
            "future_mask": lambda x: masks.future_mask(x, r, generator=gen(x)),
        }
    )
    return table


def time_interleaved(
    table: dict[str, Callable],
    x: torch.Tensor,
    repeats: int,
    block: int,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median milliseconds per call of each candidate, timed in blocks of ``block`` calls.

    Blocks of the candidates alternate, so that load from other processes hits
    them alike; within a block the caches are warm, as under ``timeit``.
    """
    cuda = x.device.type == "cuda"
    samples: dict[str, list[float]] = {name: [] for name in table}
    for function in table.values():  # warm-up: caches, allocator, lazy init
        for _ in range(3):
            function(x)
    for _ in range(max(1, repeats // block)):
        for name, function in table.items():
            if cuda:
                torch.cuda.synchronize()
            start = clock()
            for _ in range(block):
                function(x)
            if cuda:
                torch.cuda.synchronize()
            samples[name].append((clock() - start) / block)
    return {name: 1e3 * statistics.median(times) for name, times in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200, help="timed calls per candidate and shape")
    parser.add_argument(
        "--block", type=int, default=10, help="consecutive calls per timing (1: every call between other candidates)"
    )
    parser.add_argument("--device", default="cpu", help="device of the batch (default: cpu)")
    parser.add_argument("--r", type=float, default=0.15, help="masked share (default: 0.15)")
    parser.add_argument("--lm", type=float, default=3.0, help="mean masked run (default: 3)")
    parser.add_argument(
        "--clock", choices=["cpu", "wall"], default=None, help="cpu: thread CPU time (CPU default); wall: wall clock"
    )
    args = parser.parse_args()
    clock_name = args.clock or ("cpu" if torch.device(args.device).type == "cpu" else "wall")
    if clock_name == "cpu" and torch.device(args.device).type != "cpu":
        parser.error("--clock cpu times only CPU work; use --clock wall on an accelerator")
    clock = time.thread_time if clock_name == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    tsai_mask = load_tsai_subsequence_mask()
    if tsai_mask is None:
        print("tsai not installed: `pip install tsai==1.0.1 --no-deps` adds it to the comparison\n")
    table = candidates(tsai_mask, args.r, args.lm)
    print(
        f"torch {torch.__version__}, device {args.device}, 1 thread, r={args.r}, lm={args.lm}, "
        f"{args.repeats} calls each, median over blocks of {args.block}, {clock_name} clock\n"
    )
    for shape in SHAPES:
        x = torch.zeros(shape, device=args.device)
        timings = time_interleaved(table, x, args.repeats, args.block, clock)
        reference = timings.get("tsai create_subsequence_mask (stateful)")
        rand = timings["torch.rand(...) < r"]
        print(f"shape {shape}")
        print(f"| {'mask':<40} | {'ms':>8} | {'vs rand<r':>9} | {'vs tsai':>8} |")
        print(f"|{'-' * 42}|{'-' * 10}|{'-' * 11}|{'-' * 10}|")
        for name, ms in timings.items():
            versus_tsai = f"{reference / ms:7.2f}x" if reference else "     n/a"
            print(f"| {name:<40} | {ms:8.3f} | {rand / ms:8.2f}x | {versus_tsai} |")
        print()


if __name__ == "__main__":
    main()
