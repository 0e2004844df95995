"""A dataset's settings: ``spec`` (the one frozen value planning and the runtime read), ``config`` (the
keywords in three groups and their resolution), ``options`` (what is resolved at open) and ``tuning``
(every tuning constant with its reason, and the ``DASK_WINDOWS_*`` switches). Nothing is imported
here: ``planning/`` imports ``settings.spec`` and ``settings.tuning`` (stdlib and numpy only).
"""
