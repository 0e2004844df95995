"""Resident memory of the pool order over files of tiny row groups, measured in a child process.

A streaming writer's layout (row groups of 8 rows, hundreds per file) once grew RSS by hundreds of
MiB per pass at a 128 KiB budget: every read parsed its file's whole footer, and the names looked up
through ``FileMetaData.schema`` made a reference cycle that kept each parsed footer alive until a full
garbage collection. docs/memory.md promises the budget plus a constant over any number of passes;
the child measures the peak RSS of each pass above the open dataset's.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests import forkrun

if not sys.platform.startswith("linux"):
    pytest.skip("reads /proc/self/status", allow_module_level=True)

#: Above the budget, in MiB: docs/memory.md promises 96 in general (parsed footers kept, row-group heads, a
#: read in flight, what a first read imports); these files' small footers need about 25.
MEMORY_CONSTANT_MIB = 64
PASSES = 3

CHILD = r"""
import gc, json, sys, warnings
from dask_windows import WindowDataset
from dask_windows.runtime.memory import trim

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024  # MiB

def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # VmHWM back to the current RSS
        return True
    except OSError:
        return False

path, budget, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
warnings.simplefilter("ignore")  # the budget holds few units: PoolWarning, expected here
ds = WindowDataset(path, window=64, stride=8, batch_size=64, features=["f0", "f1", "f2", "f3"], buffer_bytes=budget)
trim()
base = status("VmRSS")
peaks, ends, batches = [], [], []
for _ in range(passes):
    hwm = reset_peak()
    peak, n = 0.0, 0
    for _batch in ds:
        n += 1
        peak = max(peak, status("VmRSS"))
    trim()
    ends.append(status("VmRSS") - base)
    peaks.append(max(peak, status("VmHWM") if hwm else 0.0, status("VmRSS")) - base)
    batches.append(n)
print(json.dumps({"peaks": peaks, "ends": ends, "batches": batches}))
"""


@pytest.fixture(scope="module")
def tiny_row_groups(tmp_path_factory):
    """2 files of 4,000 rows x 4 float32 columns in row groups of 8 rows (500 a file)."""
    path = tmp_path_factory.mktemp("tiny_groups")
    rng = np.random.default_rng(0)
    for i in range(2):
        table = pa.table({f"f{c}": rng.random(4000, dtype=np.float32) for c in range(4)})
        pq.write_table(table, path / f"part-{i}.parquet", row_group_size=8)
    return path


@pytest.mark.parametrize("budget", [128 << 10, 1 << 20])
def test_pool_rss_stays_within_the_budget_over_passes_of_tiny_row_groups(tiny_row_groups, budget):
    out = forkrun.run([sys.executable, "-c", CHILD, str(tiny_row_groups), str(budget), str(PASSES)], timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["batches"] == [found["batches"][0]] * PASSES and found["batches"][0] > 0
    allowed = budget / 2**20 + MEMORY_CONSTANT_MIB
    assert max(found["peaks"]) <= allowed, found
    assert found["ends"][-1] <= found["ends"][0] + 8, found  # no growth from one pass to the next


def test_parsed_footers_parse_each_file_once_and_drop_the_least_recent_past_the_limit(tiny_row_groups):
    import pickle

    from dask_windows.sources.parquet.footers import metadata_from_bytes
    from dask_windows.sources.parquet.rows import PARSED_PER_BYTE, ParsedFooters

    class Counted:  # a footer counting its parses
        def __init__(self, raw):
            self.raw, self.parses = raw, 0

        @property
        def metadata(self):
            self.parses += 1
            return metadata_from_bytes(self.raw)

    footers = []
    for name in ("part-0.parquet", "part-1.parquet"):
        data = (tiny_row_groups / name).read_bytes()
        footers.append(Counted(data[-8 - int.from_bytes(data[-8:-4], "little") :]))
    size = PARSED_PER_BYTE * footers[0].metadata.serialized_size
    footers[0].parses = 0
    kept = ParsedFooters(limit=size + size // 2)  # room for one of the two
    first = kept.get("a", footers[0])
    assert kept.get("a", footers[0]) is first and footers[0].parses == 1
    assert first.num_row_groups == 500
    kept.get("b", footers[1])  # drops "a"
    kept.get("a", footers[0])
    assert footers[0].parses == 2 and footers[1].parses == 1
    replaced = Counted(footers[0].raw)  # the file opened again: its new footer is parsed
    kept.get("a", replaced)
    assert replaced.parses == 1
    assert pickle.loads(pickle.dumps(kept))._parsed == {}


def test_a_footer_too_large_to_keep_warns_once_naming_the_file_and_the_remedy(tiny_row_groups):
    import warnings

    from dask_windows.sources.parquet.footers import metadata_from_bytes
    from dask_windows.sources.parquet.rows import ParsedFooters

    class Footer:
        def __init__(self, raw):
            self.raw = raw

        @property
        def metadata(self):
            return metadata_from_bytes(self.raw)

    data = (tiny_row_groups / "part-0.parquet").read_bytes()
    footer = Footer(data[-8 - int.from_bytes(data[-8:-4], "little") :])
    kept = ParsedFooters(limit=1)  # nothing fits: parsed on every read
    with pytest.warns(RuntimeWarning, match=r"part-0\.parquet.*500 row groups.*dask-windows convert"):
        kept.get("/data/part-0.parquet", footer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per file
        assert kept.get("/data/part-0.parquet", footer).num_row_groups == 500
    assert kept._parsed == {}
