"""A dataset's settings, one kind per module.

``spec``: ``WindowSpec``, every setting of a dataset as one frozen value, the only one the plan and
the runtime read; ``config``: ``WindowDataset``'s keywords in three frozen groups, their resolution
into that value, and ``KEYWORDS``, the one list the command line builds its options from;
``options``: what is resolved when the data is opened (the order, the piece count, ``normalize=``);
``tuning``: every tuning constant with the reason for its value, and the ``DASK_WINDOWS_*`` switches
read into one value.

Nothing is imported here: ``planning/`` imports ``settings.spec`` and ``settings.tuning`` (standard
library and numpy only).
"""
