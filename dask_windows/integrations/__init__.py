"""Training frameworks, each imported only when used (never by ``import dask_windows``): ``lightning`` (a
``LightningDataModule``), ``fastai`` (fastai/tsai ``DataLoaders``), ``pytorch_forecasting`` (``PFAdapter``);
each raises an ``ImportError`` with the ``pip install`` line when its framework is missing.
"""
