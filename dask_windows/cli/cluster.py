"""The Dask cluster of ``convert``, ``stats``, ``fit`` and ``index --scheduler``: a
``LocalCluster`` of worker processes, or the running cluster ``--scheduler`` names."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Any

logger = logging.getLogger("dask_windows.cli.main")


def _input_block_size(memory_limit: str) -> int:
    """Bytes of input per task: 64 MiB, less on small local workers."""
    from dask.utils import parse_bytes

    return 64 * 2**20 if memory_limit == "auto" else int(min(64 * 2**20, max(2**20, parse_bytes(memory_limit) / 32)))


class _Cluster:
    """Starts a LocalCluster (or connects to ``--scheduler``) on the first compute, so that bad inputs
    fail before any worker exists; on exit counts the workers restarted and closes everything."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.client: Any = None
        self.workers_restarted = 0
        self._pids: dict = {}
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Cluster:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        try:
            if self.client is not None and exc_info[0] is None:
                pids = self.client.run(os.getpid)
                self.workers_restarted = len(set(self._pids.items()) - set(pids.items()))
        finally:
            self._stack.close()

    def _start(self) -> Any:
        from distributed import Client, LocalCluster

        args = self.args
        quiet = args.verbose < 2
        if quiet:  # distributed sets its loggers' levels when imported
            for noisy in ("distributed", "tornado", "bokeh"):
                logging.getLogger(noisy).setLevel(logging.ERROR)
        if args.scheduler:
            try:
                client = Client(args.scheduler, timeout=args.connect_timeout)
            except Exception as exc:  # refused, timed out, or not a Dask scheduler at all
                raise ConnectionError(
                    f"could not reach the Dask scheduler at {args.scheduler} ({type(exc).__name__}: {exc}); check the "
                    f"address and that the scheduler is running, or leave out --scheduler to start a local cluster"
                ) from exc
        else:
            cluster = self._stack.enter_context(
                LocalCluster(
                    n_workers=args.workers,
                    threads_per_worker=args.threads_per_worker,
                    memory_limit=args.memory_limit,
                    processes=True,
                    dashboard_address=":0",
                    silence_logs=logging.CRITICAL if quiet else logging.INFO,
                    local_directory=args.local_directory,
                )
            )
            client = Client(cluster)
        self.client = self._stack.enter_context(client)
        self._pids = self.client.run(os.getpid)
        logger.info("Dask cluster: %s", self.client)
        return self.client

    def compute(self, label: str, *collections: Any) -> tuple:
        """Compute ``collections`` on the cluster, with a progress bar on stderr."""
        client = self.client or self._start()
        futures = client.compute(list(collections))
        if not self.args.no_progress:
            from distributed import progress

            print(label, file=sys.stderr, flush=True)
            with contextlib.redirect_stdout(sys.stderr):
                progress(futures)
            print(file=sys.stderr, flush=True)
        try:
            return tuple(client.gather(futures))
        except Exception as exc:
            if type(exc).__name__ != "KilledWorker":
                raise
            raise MemoryError(
                f"Dask workers kept dying while {label} ({exc}); they usually exceed their memory limit: raise "
                f"--memory-limit, use fewer --threads-per-worker or a smaller --partition-size"
            ) from exc
