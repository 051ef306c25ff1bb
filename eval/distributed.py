"""The grader's Ray backend (`python -m eval ... --backend ray`; the `ray` extra).

The grader's chunks become Ray tasks, one CPU each, at most `workers` in flight; their lines are
taken back in job order, so the episodes file is the one a local run writes, byte for byte.
`connect()` joins the cluster named by `RAY_ADDRESS` and starts an embedded one otherwise (the
sweep's Ray backend uses it too). Only the grader, when asked for this backend, imports this module (and Ray).
"""

from __future__ import annotations

import os
from collections import deque
from typing import Callable, Iterable, Iterator

try:
    import ray
except ImportError:
    raise ImportError("--backend ray needs Ray: pip install -c constraints.txt -e '.[ray]' "
                      "(make installs it)") from None


def connect(log_to_driver: bool = False) -> None:
    """Join `RAY_ADDRESS`'s cluster, or start an embedded one; nothing if Ray is up already.

    An embedded Ray's workers run at normal priority: Ray's default renices its workers to 15,
    which on a busy machine (a sweep's trainers, the other half of a test run) starves them,
    20 times slower here. A cluster of one's own keeps its operator's setting."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(address=address, include_dashboard=False, configure_logging=False,
             log_to_driver=log_to_driver)


def ordered_map(fn: Callable, items: Iterable, workers: int) -> Iterator:
    """`fn` over `items` as Ray tasks, results in the order of `items`; stopping the iteration
    cancels the tasks still in flight."""
    connect()
    remote = ray.remote(num_cpus=1, max_retries=0)(fn)
    pending: deque = deque()
    items = iter(items)
    try:
        for item in items:
            pending.append(remote.remote(item))
            if len(pending) >= workers:
                yield ray.get(pending.popleft())
        while pending:
            yield ray.get(pending.popleft())
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
