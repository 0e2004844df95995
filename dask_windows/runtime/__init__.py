"""One pass over a plan: reading units into the pool, batches, and the threads that overlap them.

``pool`` reads a plan's units and builds its steps, ``pipeline`` cuts batches (``batch``,
``window_table``), ``prefetch`` holds the threads; ``streams`` and ``epochs`` serve mixtures,
elastic resume and the epoch of each pass; ``normalize`` standardises the values.
"""
