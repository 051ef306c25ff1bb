"""Ray for the project's Ray backends (`--backend ray`; the `ray` extra): the grader's chunks as
Ray tasks here, the sweep's seeds as Tune trials in `train/ray_backend.py`.

The grader's chunks become Ray tasks, one CPU each, at most `workers` in flight; their lines are
taken back in job order, so the episodes file is the one a local run writes, byte for byte. A
chunk carries its own cases (`grader.Chunk`), never the private split's master seed, which stays
in the driver: a node sees the cases it grades, which is why the private split is graded only on
a cluster its operator trusts with the split (`eval verify --backend ray`, docs/trust.md).
`connect()` joins the cluster named by `RAY_ADDRESS` and starts an embedded one otherwise (the
sweep's Ray backend uses it too). Nothing imports Ray but through `require_ray()`, which every
Ray backend calls before it writes anything: without the extra, `--backend ray` is one clear
error that says how to install it, not an import error halfway through a run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections import deque
from pathlib import Path
from typing import Callable, Iterable, Iterator

INSTALL = "pip install -c constraints.txt -e '.[ray]' (make installs it)"
UNSHARED = ("PYTHONPATH", "FINALITY_MASTER_SEED")  # never in an embedded Ray's environment
SECRET = re.compile(r"KEY|TOKEN|SECRET|PASSWORD", re.IGNORECASE)  # nor these


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
    hidden = {}
    if not address:
        os.environ.setdefault("RAY_worker_niceness", "0")
        # The processes an embedded Ray starts keep this environment for the whole run: never
        # a bundle's folder on the import path (its code would be imported by Ray itself,
        # outside the sandbox), nor the master seed or a key
        hidden = {k: os.environ.pop(k) for k in list(os.environ)
                  if k in UNSHARED or SECRET.search(k)}
    try:
        ray.init(address=address, include_dashboard=False, configure_logging=False,
                 log_to_driver=False)
    finally:
        os.environ.update(hidden)


def ordered_map(fn: Callable, items: Iterable, workers: int,
                nodes: list[str] | None = None) -> Iterator:
    """`fn` over `items` as Ray tasks, results in the order of `items`; stopping the iteration
    cancels the tasks still in flight. With `nodes` (ids, as `on_every_node` found them) the
    tasks run on those nodes only, in turn: a node that joins the cluster later, never checked,
    gets none."""
    ray = require_ray()
    connect()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    remote = ray.remote(num_cpus=1, max_retries=0)(fn)
    pending: deque = deque()
    items = iter(items)
    try:
        for i, item in enumerate(items):
            where = remote if nodes is None else remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)],
                                                                   soft=False))
            pending.append(where.remote(item))
            if len(pending) >= workers:
                yield ray.get(pending.popleft())
        while pending:
            yield ray.get(pending.popleft())
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def on_every_node(fn: Callable[[], object]) -> dict[str, tuple[str, object]]:
    """`fn()` once on every live node of the cluster that has a CPU: {name: (node id, result)},
    by host name (`host #1`, `host #2` for nodes of one host). The grader checks there what
    must hold where the cases run, not only where the driver does (the sandbox's self-test, the
    policies' files), and then grades on those nodes alone. A node where it raises raises here,
    named."""
    ray = require_ray()
    connect()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    def named():
        import socket
        return socket.gethostname(), fn()

    remote = ray.remote(num_cpus=1, max_retries=0)(named)
    nodes = [node for node in ray.nodes() if node["Alive"] and node["Resources"].get("CPU", 0) >= 1]
    refs = {(node["NodeManagerAddress"], node["NodeID"]): remote.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)).remote()
        for node in nodes}  # by node id: the nodes of one host share its address
    found: dict[str, list] = {}
    for (address, node_id), ref in refs.items():
        try:
            host, result = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            raise ValueError(f"on the Ray node {node_id[:12]} at {address}: "
                             f"{type(exc.cause).__name__}: {exc.cause}") from exc.cause
        found.setdefault(host, []).append((node_id, result))
    # Nodes that share a host (several `ray start` on one machine) are numbered, not merged, in
    # an order of what they proved, not of their ids: the names of a restarted cluster are the
    # same, so that a run resumes on it (a run pins them: `runfolder.pin`).
    return {host if len(results) == 1 else f"{host} #{k}": pair
            for host, results in sorted(found.items())
            for k, pair in enumerate(sorted(results, key=lambda p: json.dumps(p[1])), 1)}


def code_digest() -> str:
    """A digest of the grader's code as this process imports it (every source file of
    `finality_gym`, `agents` and `eval`): nodes that grade alike run the same code."""
    import agents
    import finality_gym
    roots = {"finality_gym": Path(finality_gym.__file__).parent,
             "agents": Path(agents.__file__).parent, "eval": Path(__file__).resolve().parents[1]}
    digest = hashlib.sha256()
    for name, root in roots.items():
        for path in sorted(root.rglob("*.py")):
            digest.update(f"{name}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _facts() -> dict:
    """What a node must share with the driver for its rows to be the driver's: the grader's
    code and a case's limits (from the node's own environment)."""
    from agents.sandbox.limits import limits
    return {"code": code_digest(), "limits": limits()}


def _node_check(specs: tuple[str, ...], identity: Callable[[str], str | None],
                sandbox: bool) -> tuple[dict, object, dict, int]:
    """On a node: the hash of each policy's file as the node sees it (None: it cannot read it),
    what its sandbox proves (`self_test`), if asked, its `_facts` and its workers' priority."""
    from agents.sandbox.self_test import self_test
    seen = {}
    for spec in specs:
        try:
            seen[spec] = identity(spec)
        except (OSError, ValueError):  # a missing file is a ValueError of the spec's loader
            seen[spec] = None
    return seen, self_test() if sandbox else None, _facts(), os.nice(0)


def check_nodes(inputs: dict[str, str], identity: Callable[[str], str | None],
                sandbox: bool) -> tuple[list[str], dict | None]:
    """Every node of the cluster checked before a case runs there: it runs the driver's code
    with its limits (`_facts`), at normal priority (a case's time limit is wall time: a starved
    worker would fail the entry), sees each policy's file (`inputs`: spec -> hash, by
    `identity`, the grader's `input_identity`) as the driver does, at the same path with the
    same hash (the repository and the board on a filesystem every node shares), and, for outside
    code (`sandbox`), its sandbox proves itself. The ids of the nodes checked (the chunks go to
    them alone: `ordered_map`'s `nodes`) and, with `sandbox`, what each one proved, by name. A
    node that fails, or a cluster without one, is a ValueError naming it, before any case."""
    found = on_every_node(functools.partial(_node_check, tuple(inputs), identity, sandbox))
    if not found:
        raise ValueError("the Ray cluster has no node with a CPU to check: the cases would "
                         "wait for nodes that join later, never checked")
    mine = _facts()
    for name, (_, (seen, _, facts, nice)) in found.items():
        for what in ("code", "limits"):
            if facts[what] != mine[what]:
                raise ValueError(f"the Ray node {name} runs other grader {what} than this "
                                 f"machine ({facts[what]} there, {mine[what]} here)")
        if nice != 0:
            raise ValueError(f"the Ray node {name} runs its workers at nice {nice}: start it "
                             "with RAY_worker_niceness=0 (a case's time limit is wall time)")
        for spec, digest in inputs.items():
            if seen[spec] != digest:
                raise ValueError(
                    f"the Ray node {name} does not see {spec} as this machine does (its file "
                    f"is {'missing there' if seen[spec] is None else 'another there'}): every "
                    "node must see the repository and the policies' files at the paths used "
                    "here (a shared filesystem)")
    proved = {name: result[1] for name, (_, result) in found.items()} if sandbox else None
    return [node for node, _ in found.values()], proved
