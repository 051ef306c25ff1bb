"""Ray for the project's Ray backends (`--backend ray`; the `ray` extra): the grader's chunks as
Ray tasks here, the sweep's seeds as Tune trials in `train/ray_backend.py`.

The grader's chunks become Ray tasks, one CPU each, at most `workers` in flight; their lines are
taken back in job order, so the episodes file is the one a local run writes, byte for byte.
`connect()` joins the cluster named by `RAY_ADDRESS` and starts an embedded one otherwise (the
sweep's Ray backend uses it too). Nothing imports Ray but through `require_ray()`, which every
Ray backend calls before it writes anything: without the extra, `--backend ray` is one clear
error that says how to install it, not an import error halfway through a run.
"""

from __future__ import annotations

import os
from collections import deque
from typing import Callable, Iterable, Iterator

INSTALL = "pip install -c constraints.txt -e '.[ray]' (make installs it)"


def require_ray():
    """The `ray` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise ImportError(f"--backend ray needs Ray: {INSTALL}") from None
    return ray


def connect() -> None:
    """Join `RAY_ADDRESS`'s cluster, or start an embedded one; nothing if Ray is up already.
    The workers' output stays in Ray's logs: a backend reports what matters itself.

    An embedded Ray's workers run at normal priority: Ray's default renices its workers to 15,
    which on a busy machine (a sweep's trainers, the other half of a test run) starves them,
    20 times slower here. A cluster of one's own keeps its operator's setting."""
    ray = require_ray()
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(address=address, include_dashboard=False, configure_logging=False,
             log_to_driver=False)


def ordered_map(fn: Callable, items: Iterable, workers: int) -> Iterator:
    """`fn` over `items` as Ray tasks, results in the order of `items`; stopping the iteration
    cancels the tasks still in flight."""
    ray = require_ray()
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


def on_every_node(fn: Callable[[], object]) -> dict[str, object]:
    """`fn()` once on every live node of the cluster that has a CPU, by host name: the sandbox's
    self-test, which must hold where the cases run, not only where the driver does. A node where
    it raises raises here, named."""
    ray = require_ray()
    connect()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def named():
        import socket
        return socket.gethostname(), fn()

    remote = ray.remote(num_cpus=1, max_retries=0)(named)
    nodes = [node for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) >= 1]
    refs = {node["NodeManagerAddress"]: remote.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
        for node in nodes}
    found = {}
    for address, ref in refs.items():
        try:
            host, result = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            raise type(exc.cause)(f"on the Ray node {address}: {exc.cause}") from None
        found[host] = result
    return found
