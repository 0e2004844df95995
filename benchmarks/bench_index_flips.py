"""Every byte of a dataset index flipped, one at a time, each opened in a child process.

    PYTHONPATH=. python benchmarks/bench_index_flips.py [--every 1] [--limit N]

The index of a small dataset (3 files, ``tests/index_flips.make_dataset``) is
damaged at each position in turn (the byte XORed with 0xA5) and the dataset is
opened with it and read for one epoch in a forked child (``tests/index_flips``).
Printed: the index's size, how many positions gave each outcome (``unchanged``
batches, ``refused`` with a ``DataError`` naming the index and the remedy,
``unclear`` any other error, ``silent`` other batches without an error,
``crash`` a child killed by a signal or hung), the positions of the last three
kinds, and the time. The target: 0 crash, 0 silent, 0 unclear.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def main() -> None:
    import index_flips

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=1, help="flip every Nth position (1: all)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many positions")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        index, blob, want = index_flips.make_dataset(root)
        positions = list(range(0, len(blob), args.every))[: args.limit]
        started = time.perf_counter()
        outcomes = index_flips.flip_outcomes(root, index, blob, want, positions)
        seconds = time.perf_counter() - started
    counts = collections.Counter(outcomes.values())
    footer = index_flips.footer_start(blob)
    print(
        f"index of {len(blob):,} bytes (its Parquet footer from byte {footer:,}); {len(positions):,} positions flipped"
    )
    print("  ".join(f"{k} {counts.get(k, 0)}" for k in index_flips.OUTCOMES))
    for kind in ("unclear", "silent", "crash"):
        hit = [p for p, o in outcomes.items() if o == kind]
        if hit:
            print(f"{kind} at positions {hit[:40]}{' ...' if len(hit) > 40 else ''}")
    print(f"{seconds:.1f} s ({seconds / max(1, len(positions)) * 1e3:.1f} ms a position)")


if __name__ == "__main__":
    main()
