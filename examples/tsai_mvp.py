"""tsai's MVP pretraining on Parquet streamed by WindowDataset, then a forecaster fine-tuned on its encoder.

    python examples/tsai_mvp.py                          # TSTPlus, MVP then forecasting
    python examples/tsai_mvp.py --arch InceptionTimePlus
    python examples/tsai_mvp.py --epochs 1 --rows 512    # a quick run

Needs tsai (fastai, and through it torchvision: tsai's models import ``fastai.vision.models``,
which imports ``torchvision.models``). Install it with the torch you have pinned, or pip replaces
a CPU torch with a CUDA build of several GB::

    python -c "import torch; print('torch==' + torch.__version__)" > constraints.txt
    pip install -c constraints.txt tsai   # CPU torch: add --extra-index-url https://download.pytorch.org/whl/cpu

Data and results go under ``demo_data/`` and ``runs/`` (ignored by git) unless ``--data`` and
``--out`` say otherwise.

A synthetic dataset of multi-channel series in Parquet files is written on first use
(``--data``). ``WindowDataset`` streams shuffled, per-window standardised windows of it;
``dask_windows.integrations.fastai.WindowDataLoaders`` hands them to tsai as fastai ``DataLoaders`` (with
``vars``, ``len``, ``c``, ``d``), batches ``(x,)`` for the self-supervised pretraining.

1. **Pretraining**: tsai's ``MVP`` callback masks subsequences of each window and trains the
   architecture (``--arch``) to reconstruct them; it saves the best encoder weights.
2. **Fine-tuning**: a forecaster of the next ``--horizon`` values of ``y`` after each window,
   built with the same architecture, starts from the pretrained weights (``transfer_weights``,
   head excluded) and is trained with fastai's one-cycle schedule.

fastai's progress bar shows each epoch; the loss curves of both stages are saved as a PNG.
"""

from __future__ import annotations

import argparse
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

import dask_windows as dw
from dask_windows.integrations.fastai import WindowDataLoaders

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _synthetic import make_dataset

CHANNELS = 4
FEATURES = [f"f{c}" for c in range(CHANNELS)]


#: How to install tsai without pip replacing the installed torch (a CPU torch by a CUDA build of GBs).
TSAI_INSTALL = (
    "this example needs tsai; install it with your torch pinned, or pip replaces it:\n"
    "    python -c \"import torch; print('torch==' + torch.__version__)\" > constraints.txt\n"
    "    pip install -c constraints.txt tsai\n"
    "(with a CPU torch add --extra-index-url https://download.pytorch.org/whl/cpu for a CPU torchvision)"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default="TSTPlus", choices=["TSTPlus", "InceptionTimePlus"])
    parser.add_argument("--data", default="demo_data/tsai_mvp", help="folder of the synthetic Parquet dataset")
    parser.add_argument("--out", default="runs/tsai_mvp", help="where weights and the loss plot go")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--horizon", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rows", type=int, default=2048, help="rows per synthetic series")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def datasets(args: argparse.Namespace, **kwargs) -> tuple[dw.WindowDataset, dw.WindowDataset]:
    """Train/valid windows split per series in time (the last 20% of each series is validation)."""
    path = make_dataset(args.data, num_files=4, series_per_file=8, rows_per_series=args.rows, channels=CHANNELS,
                        seed=args.seed)  # fmt: skip
    ds = dw.WindowDataset(path, features=FEATURES, series="series_id", window=args.window, stride=args.window // 4,
                          batch_size=args.batch_size, seed=args.seed, normalize="sample", **kwargs)  # fmt: skip
    return ds.split(valid=0.2, embargo=args.window)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        from fastai.losses import MSELossFlat
        from tsai.callback.MVP import MVP
        from tsai.learner import ts_learner
        from tsai.models.utils import transfer_weights
    except ImportError as exc:
        raise SystemExit(f"{exc}\n{TSAI_INSTALL}") from exc

    os.makedirs(args.out, exist_ok=True)
    # 1. Self-supervised: batches are (x,); MVP builds the targets by masking x.
    pre_dls = WindowDataLoaders.from_datasets(*datasets(args))
    fname = f"{args.arch}_mvp"
    pretrain = ts_learner(pre_dls, args.arch, cbs=[MVP(target_dir=args.out, fname=fname)], seed=args.seed)
    pretrain.fit_one_cycle(args.epochs, args.lr)
    weights = os.path.join(args.out, f"{fname}.pth")

    # 2. Forecast the next `horizon` values of y: batches are (x, y) with y (B, 1, horizon).
    dls = WindowDataLoaders.from_datasets(*datasets(args, targets=["y"], horizon=args.horizon))
    forecast = ts_learner(dls, args.arch, loss_func=MSELossFlat(), seed=args.seed)
    transfer_weights(forecast.model, weights, exclude_head=True)
    forecast.fit_one_cycle(args.epochs, args.lr)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    for ax, learn, title in ((axes[0], pretrain, "MVP pretraining"), (axes[1], forecast, "fine-tuned forecaster")):
        ax.plot(learn.recorder.losses, label="train (per batch)")
        valid = [v[1] for v in learn.recorder.values]
        steps = [len(learn.dls.train) * (e + 1) for e in range(len(valid))]
        ax.plot(steps, valid, "o-", label="valid (per epoch)")
        ax.set_title(f"{args.arch}: {title}")
        ax.set_xlabel("batch")
        ax.legend()
    plot = os.path.join(args.out, f"{args.arch}_losses.png")
    fig.tight_layout()
    fig.savefig(plot)
    result = {"weights": weights, "plot": plot, "valid_loss": float(forecast.recorder.values[-1][1])}
    print(f"pretrained encoder: {weights}\nloss curves: {plot}\nforecaster valid MSE: {result['valid_loss']:.4f}")
    return result


if __name__ == "__main__":
    main()
