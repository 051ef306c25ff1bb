"""`eval verify --backend ray` on a two-node local Ray cluster (`ray.cluster_utils.Cluster`, one
CPU a node, joined through `RAY_ADDRESS` as an operator's own cluster is): three bundles (outside
code in the sandbox, a saved model read as data, a scripted rule) give the rows a local verify
gives, byte for byte, though the driver was killed mid-run and run again; the sandbox proved
itself on both nodes, and the entry and the page say so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ray.cluster_utils import Cluster

from eval.__main__ import main as eval_cli
from finality_gym.corpus import new_master_seed

from tests.board.test_board import PROBE_THEN_SHIP

ROOT = Path(__file__).resolve().parents[2]
# 48 tasks x 3 seeds: two chunks of work a split, so both nodes grade
PROTOCOL = ["--subset", "stratified", "--seeds", "3", "--workers", "2", "--no-progress"]
NAMES = ("probe", "ppo", "gate")


@contextmanager
def two_nodes(nodes: int = 2, head_cpus: int = 1, niceness: str = "0"):
    """A cluster of `nodes` nodes (two by default; the head with `head_cpus` CPUs, the others
    one) and its address, its workers at `niceness` (0: `distributed.connect`'s reason)."""
    before = os.environ.get("RAY_worker_niceness")
    os.environ["RAY_worker_niceness"] = niceness
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": head_cpus, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster, cluster.address
    finally:
        cluster.shutdown()
        if before is None:
            del os.environ["RAY_worker_niceness"]
        else:
            os.environ["RAY_worker_niceness"] = before


def _bundles(base: Path) -> list[str]:
    (base / "probe_then_ship.py").write_text(PROBE_THEN_SHIP)
    specs = (f"{base / 'probe_then_ship.py'}:ProbeThenShip", f"sb3:{ROOT / 'models/ppo_full.zip'}",
             "finality_gate")
    for name, spec in zip(NAMES, specs):
        assert eval_cli(["submit", spec, "--name", name, "--out", str(base / f"{name}.finality")]) == 0
    return [str(base / f"{name}.finality") for name in NAMES]


def _rows(board: Path) -> dict[str, bytes]:
    return {str(p.relative_to(board)): p.read_bytes() for p in board.glob("*/*/episodes.jsonl")}


def test_a_ray_verify_killed_and_resumed_writes_the_local_rows(tmp_path):
    (tmp_path / "seed").write_text(f"{new_master_seed()}\n")
    bundles = _bundles(tmp_path)
    seed = ["--master-seed-file", str(tmp_path / "seed")]
    verify = [sys.executable, "-m", "eval", "verify", *bundles, *seed, *PROTOCOL]
    # as its own process, as an operator runs it: this one may hold an earlier test's Ray client
    # threads, which a worker the local grader forks would inherit mid-lock
    local = subprocess.run([*verify, "--out", str(tmp_path / "local")], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
    assert local.returncode == 0, local.stderr[-3000:]
    with two_nodes() as (_, address):
        board = tmp_path / "ray"
        command = [*verify, "--backend", "ray", "--out", str(board)]
        env = {**os.environ, "RAY_ADDRESS": address}
        first = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        rows = board / "public" / "probe" / "episodes.jsonl"
        deadline = time.monotonic() + 300
        while not (rows.is_file() and rows.read_bytes().count(b"\n")):
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no row in 300 s"
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGKILL)  # the driver, killed mid-run
        first.wait()
        first.stderr.close()
        left = _rows(board)
        assert len(b"".join(left.values()).splitlines()) < 6 * 144  # it was killed mid-run
        second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=600)
        assert second.returncode == 0, second.stderr[-3000:]
    local, remote = _rows(tmp_path / "local"), _rows(board)
    assert sorted(remote) == sorted(local) and len(local) == 6
    assert remote == local  # byte for byte, though graded on two nodes and resumed
    for name, kept in left.items():  # every complete line the killed run wrote is kept (outside
        # code's rows are written as cases complete, in a random order, and sorted at the end)
        assert set(kept[:kept.rfind(b"\n") + 1].splitlines()) <= set(remote[name].splitlines())
    assert all(len(graded.splitlines()) == 144 for graded in remote.values())
    entries = {n: json.loads((board / "entries" / n / "entry.json").read_text()) for n in NAMES}
    assert {e["status"] for e in entries.values()} == {"verified"}
    nodes = entries["probe"]["sandbox_nodes"]
    assert len(nodes) == 2 and list(nodes.values()) == [entries["probe"]["sandbox"]] * 2, nodes
    assert all("sandbox_nodes" not in entries[n] for n in ("ppo", "gate"))  # no outside code
    assert eval_cli(["leaderboard", str(board), "--out", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "index.html").read_text()
    assert "proven on each of 2 Ray nodes" in page
    published = (tmp_path / "site" / "board.json").read_text()
    assert json.loads(published)["entries"]["probe"]["sandbox_nodes"] == {
        "nodes": 2, "as_the_grader": True}
    assert all(f'"{name}"' not in published + page for name in nodes)  # the hosts stay here


LANG_SAYS = '''import os
from finality_gym.policy import Policy

class LangSays(Policy):
    """Ships where the node's LANG is the late node's, refunds elsewhere."""
    name = "lang_says"
    def plan(self):
        yield ("ship", {}) if os.environ.get("LANG") == "late.node" else ("refund", {})
'''


def test_a_node_that_joins_mid_run_grades_nothing_and_a_node_that_sees_other_files_stops_it(
        tmp_path):
    """Chunks go only to the nodes checked before the first case (a node that joins later was
    never checked: its sandbox, its files), and a node that sees a policy's file otherwise than
    the driver stops the run, named, before any case."""
    (tmp_path / "lang_says.py").write_text(LANG_SAYS)
    spec = f"{tmp_path / 'lang_says.py'}:LangSays"
    out = tmp_path / "run"
    command = [sys.executable, "-m", "eval", "headline", "--policies", spec, "--seeds", "3",
               "--workers", "1", "--backend", "ray", "--no-progress", "--out", str(out)]
    with two_nodes(nodes=1) as (cluster, address):
        env = {**os.environ, "RAY_ADDRESS": address}
        run = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
        rows = out / "episodes.jsonl"
        deadline = time.monotonic() + 300
        while not (rows.is_file() and rows.read_bytes().count(b"\n")):
            assert run.poll() is None, run.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no row in 300 s"
            time.sleep(0.1)
        cluster.add_node(num_cpus=1, env_vars={"LANG": "late.node"})
        cluster.wait_for_nodes()
        assert run.wait(timeout=600) == 0, run.stderr.read()[-3000:]
        run.stderr.close()
        graded = [json.loads(line) for line in rows.read_text().splitlines()]
        assert len(graded) == 963 and {r["disposition"] for r in graded} == {"refund"}
        # the late node is up and would have run them: it takes a case of a new run
        again = subprocess.run([*command[:-1], str(tmp_path / "again")], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "ship" in (tmp_path / "again" / "episodes.jsonl").read_text()
        check = ("from eval.grading.distributed import check_nodes; from eval.grading.grader "
                 f"import input_identity; check_nodes({{{spec!r}: '0' * 64}}, input_identity, "
                 "False)")
        other = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=300)
        assert other.returncode != 0
        assert (f"ValueError: the Ray node {socket.gethostname()} #1 does not see {spec} as "
                "this machine does (its file is another there)") in other.stderr
        # a package bundle is verified locally: on Ray its folder would be on Ray's own path
        package = tmp_path / "src" / "lang_pkg"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "agent.py").write_text(LANG_SAYS)
        bundle = tmp_path / "pkg.finality"
        submit = subprocess.run([sys.executable, "-m", "eval", "submit", "lang_pkg.agent:LangSays",
                                 "--name", "pkg", "--out", str(bundle)], cwd=tmp_path / "src",
                                capture_output=True, text=True, timeout=300,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert submit.returncode == 0, submit.stderr[-2000:]
        (tmp_path / "seed").write_text(f"{new_master_seed()}\n")
        refused = subprocess.run([sys.executable, "-m", "eval", "verify", str(bundle),
                                  "--master-seed-file", str(tmp_path / "seed"), "--backend",
                                  "ray", "--out", str(tmp_path / "board")], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2
        assert "bundle pkg: a package (lang_pkg.agent:LangSays) is verified with --backend " \
            "local" in refused.stderr
        assert not (tmp_path / "board" / "entries" / "pkg").exists()


def test_a_cluster_that_would_not_grade_as_this_machine_is_refused_before_any_case():
    """No node with a CPU (the cases would wait for nodes never checked), a node whose workers
    are niced (a case's limit is wall time), a node with other limits: each refused, named."""
    check = ("from eval.grading.distributed import check_nodes; from eval.grading.grader "
             "import input_identity; check_nodes({}, input_identity, False)")

    def refusal(address: str) -> str:
        done = subprocess.run([sys.executable, "-c", check], cwd=ROOT, capture_output=True,
                              text=True, timeout=300, env={**os.environ, "RAY_ADDRESS": address})
        assert done.returncode != 0, done.stdout
        return done.stderr

    with two_nodes(nodes=1, head_cpus=0) as (_, address):
        assert "the Ray cluster has no node with a CPU to check" in refusal(address)
    with two_nodes(nodes=1, niceness="15") as (_, address):
        assert "runs its workers at nice 15: start it with RAY_worker_niceness=0" in \
            refusal(address)
    with two_nodes(nodes=1) as (cluster, address):
        cluster.add_node(num_cpus=1, env_vars={"FINALITY_POLICY_TIMEOUT": "5"})
        cluster.wait_for_nodes()
        assert "runs other grader limits than this machine" in refusal(address)
