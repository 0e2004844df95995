"""A synthetic multi-series partitioned Parquet dataset for the examples.

Each series mixes a few sinusoids of its own random periods and phases with
AR(1) noise; its channels share those components through a random mixing
matrix, so one channel helps predict another, and each channel has its own
offset and scale, so windows need standardising. Rows are sorted by
``(series_id, timestamp)`` and cut into files off the series boundaries: the
series at every cut spans two files, as in real exports.

Columns: ``series_id`` (int64), ``timestamp`` (ms), ``f0 .. f{C-1}``
(float32) and the target ``y`` (float32, the noise-free signal of ``f0``
ten steps ahead).
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["demo_dataset", "make_dataset"]

_COMPONENTS = 3  # sinusoids per series
_AR_DECAY = 0.9  # AR(1) coefficient of the noise
_HORIZON = 10  # steps ahead of the target y


def make_dataset(
    path: str | os.PathLike,
    num_files: int = 8,
    series_per_file: int = 16,
    rows_per_series: int = 4096,
    channels: int = 4,
    seed: int = 0,
) -> str:
    """Writes the dataset to the folder ``path`` unless it already holds Parquet files.

    Args:
        path: Output folder; created if missing.
        num_files: Number of Parquet files.
        series_per_file: Series per file on average (the total is
            ``num_files * series_per_file``).
        rows_per_series: Rows (time steps) of every series.
        channels: Number of feature columns ``f0 .. f{channels-1}``.
        seed: Seed of everything random.

    Returns:
        ``path`` as a string.

    Raises:
        ValueError: ``path`` holds Parquet files in subfolders only (the demo's
            ``train/`` and ``valid/``: writing beside them would duplicate them
            for a loader reading the folder recursively), or it was written with
            other settings (reusing it would train on other data than asked for).
    """
    path = os.fspath(path)
    settings = {
        "num_files": num_files,
        "series_per_file": series_per_file,
        "rows_per_series": rows_per_series,
        "channels": channels,
        "seed": seed,
    }
    record = os.path.join(path, "_synthetic.json")
    if os.path.isdir(path) and any(name.endswith(".parquet") for name in os.listdir(path)):
        if os.path.exists(record):
            with open(record) as src:
                written = json.load(src)
            if written != settings:
                raise ValueError(
                    f"{path} holds a synthetic dataset written with {written}, not {settings}; "
                    "pass another --data folder"
                )
        return path
    nested = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names if n.endswith(".parquet")]
    if nested:
        raise ValueError(
            f"{path} holds Parquet files in subfolders ({nested[0]}, ...): it looks like the "
            f"demo's folder (train/ and valid/); pass {os.path.join(path, 'train')} or another folder"
        )
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    num_series = num_files * series_per_file
    features, target = zip(*(_series(rng, rows_per_series, channels) for _ in range(num_series)))
    columns = {
        "series_id": np.repeat(np.arange(num_series, dtype=np.int64), rows_per_series),
        "timestamp": np.tile(
            np.datetime64("2024-01-01T00:00", "ms") + np.arange(rows_per_series) * np.timedelta64(1, "m"),
            num_series,
        ),
    }
    stacked = np.concatenate(features)  # axes: row, channel
    for channel in range(channels):
        columns[f"f{channel}"] = stacked[:, channel]
    columns["y"] = np.concatenate(target)
    table = pa.table(columns)
    # Cut half a series off the file boundaries, so the series at each cut spans two files.
    total = num_series * rows_per_series
    cuts = [0] + [i * total // num_files + rows_per_series // 2 for i in range(1, num_files)] + [total]
    for number, (start, stop) in enumerate(zip(cuts[:-1], cuts[1:])):
        part = table.slice(start, stop - start)
        tmp = os.path.join(path, f".part-{number:05d}.parquet.tmp")
        pq.write_table(part, tmp, row_group_size=max(1, (stop - start) // 4))
        os.replace(tmp, os.path.join(path, f"part-{number:05d}.parquet"))  # no half-written file
    with open(record, "w") as out:  # "_" name: loaders skip it
        json.dump(settings, out)
    return path


def demo_dataset(data: str | os.PathLike, channels: int = 4, seed: int = 0) -> tuple[str, str]:
    """The examples' shared layout: ``data/train`` (8 files, 128 series) and ``data/valid``
    (1 file, 16 other series), written on first use and reused by every example after it.

    Returns:
        ``(train, valid)`` folders.
    """
    data = os.fspath(data)
    train = os.path.join(data, "train")
    valid = os.path.join(data, "valid")
    written = not os.path.isdir(train)
    make_dataset(train, channels=channels, seed=seed)
    make_dataset(valid, num_files=1, channels=channels, seed=seed + 1)
    print(f"data: {'wrote' if written else 'reusing'} {train} (training) and {valid} (held out)")
    return train, valid


def _series(rng: np.random.Generator, rows: int, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """One series: float32 features ``(rows, channels)`` and target ``(rows,)``."""
    steps = np.arange(rows + _HORIZON)
    periods = np.exp(rng.uniform(np.log(8.0), np.log(200.0), _COMPONENTS))
    phases = rng.uniform(0.0, 2.0 * np.pi, _COMPONENTS)
    amplitudes = rng.uniform(0.5, 1.5, _COMPONENTS)
    waves = amplitudes * np.sin(2.0 * np.pi * steps[:, None] / periods + phases)  # axes: step, component
    mixing = rng.normal(0.0, 1.0, (_COMPONENTS, channels))
    signal = waves @ mixing  # axes: step, channel
    noise = _ar1(rng.normal(0.0, 0.3, (rows, channels)), _AR_DECAY)
    offsets = rng.normal(0.0, 5.0, channels)
    scales = np.exp(rng.uniform(np.log(0.5), np.log(20.0), channels))
    features = (signal[:rows] + noise) * scales + offsets
    target = signal[_HORIZON:, 0] * scales[0] + offsets[0]
    return features.astype(np.float32), target.astype(np.float32)


def _ar1(shocks: np.ndarray, decay: float, memory: int = 64) -> np.ndarray:
    """AR(1) filter along axis 0, truncated after ``memory`` steps (decay**64 ~ 1e-3)."""
    kernel = decay ** np.arange(memory)
    return np.stack([np.convolve(shocks[:, c], kernel)[: len(shocks)] for c in range(shocks.shape[1])], axis=1)
