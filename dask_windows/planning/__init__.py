"""What an epoch yields, decided before anything is read: pure functions of their inputs.

The window grid (``windows``, ``index``), the epoch order and its division between ranks and
workers (``plan``, ``world``), splits, mid-epoch and elastic resume arithmetic, a mixture's
schedule and the mixing report. numpy and the standard library only, nothing of
``runtime``, ``speedups`` or ``sources`` imported; no file opened here (the scans at open take
a reader callable, which ``index`` and ``split`` may call from a thread pool).
"""
