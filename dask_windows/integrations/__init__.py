"""Training frameworks, each imported only when used: ``lightning`` (a ``LightningDataModule``),
``fastai`` (fastai/tsai ``DataLoaders``) and
``pytorch_forecasting`` (PyTorch Forecasting's models on named batches: ``PFAdapter``).

Nothing here is imported by ``import dask_windows``; each module raises an ``ImportError`` with the
``pip install`` line when its framework is missing.
"""
