"""One pass over a plan: reading, decoding, buffers, batches, and the threads that overlap them.

``reading`` turns a reader's plan into row blocks, ``pipeline`` builds buffers from them and
cuts batches (``buffer``, ``blocks``, ``batch``, ``window_table``); ``prefetch`` holds the
reader and builder threads. ``streams`` and ``epochs`` serve mixtures, elastic resume and the
epoch of each pass.

``normalize`` standardises the values: global statistics once per decoded partition, per-window
ones per batch.
"""
