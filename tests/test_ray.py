"""The Ray backends on a real embedded Ray (2 CPUs, started once for the test session's Ray
tests: they share one xdist group, see the Makefile's `--dist loadgroup`): a sweep's trials
write what the local backend writes, a killed sweep resumes through Tune's restore without
redoing a finished seed, and the grader's chunks on Ray write the local episodes file."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from eval.grader import RunConfig, grade, use_backend
from train.__main__ import main as train_cli

from test_sweep import TINY, same_model, snapshot

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.xdist_group("ray")


@pytest.fixture(scope="session")
def cluster():
    os.environ["RAY_worker_niceness"] = "0"  # as eval.distributed.connect does for its own
    info = ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield info.address_info["gcs_address"]
    ray.shutdown()


def comparable(summary: dict) -> dict:
    """A sweep's summary without its wall times."""
    for seed in summary["training"].values():
        del seed["train_seconds"]
    return summary


def layout(folder: Path) -> list[str]:
    """The files of a sweep folder, TensorBoard event files by count (their names hold the
    host and the time), Tune's own folder left out."""
    names = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and rel.parts[0] != "tune":
            names.append(str(rel.parent / "events") if rel.name.startswith("events.out.")
                         else str(rel))
    return names


def test_a_ray_sweep_writes_what_a_local_sweep_writes(cluster, tmp_path, capsys):
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert train_cli(["sweep", "--seeds", "0-1", "--out", str(local), *TINY]) == 0
    assert train_cli(["sweep", "--seeds", "0-1", "--backend", "ray", "--out", str(remote),
                      *TINY]) == 0
    assert layout(local) == layout(remote)
    assert (comparable(json.loads((local / "summary.json").read_text()))
            == comparable(json.loads((remote / "summary.json").read_text())))
    for seed in (0, 1):
        assert same_model(local / f"seed_{seed}" / "best_model.zip",
                          remote / f"seed_{seed}" / "best_model.zip")
    # Tune got every validation's metrics and a checkpoint from each trial
    trials = sorted((remote / "tune" / "seeds_0-1").glob("seed_*"))
    assert [t.name for t in trials] == ["seed_0", "seed_1"]
    for trial in trials:
        reported = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        assert [r["timesteps"] for r in reported if "validation_mean_gap" in r] == [
            json.loads(line)["timesteps"] for line in
            (remote / trial.name / "validation.jsonl").read_text().splitlines()]
        assert list(trial.glob("checkpoint_*/model.zip"))


def _sweep_command(out: Path) -> list[str]:
    return [sys.executable, "-m", "train", "sweep", "--backend", "ray", "--seeds", "0-1",
            "--workers", "1", "--out", str(out), *TINY[:1], "8192", *TINY[2:]]


def _trial_processes() -> list[int]:
    """Ray workers running a Tune trial (their process titles name the trainable)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and b"ray::ImplicitFunc" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_a_killed_ray_sweep_resumes_without_redoing_a_finished_seed(cluster, tmp_path):
    out = tmp_path / "sweep"
    env = {**os.environ, "RAY_ADDRESS": cluster, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(_sweep_command(out), cwd=ROOT, env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not list((out / "seed_1" / "checkpoints").glob("*.zip")):
        assert first.poll() is None, "the sweep ended before it could be killed"
        assert time.monotonic() < deadline, "seed 1 never started"
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert not (out / "seed_1" / "result.json").exists()
    while _trial_processes():  # Ray ends the dead driver's trials
        assert time.monotonic() < deadline, "the killed sweep's trial lives on"
        time.sleep(0.1)
    done = snapshot(out / "seed_0")
    assert (out / "seed_0" / "result.json") in done
    second = subprocess.run(_sweep_command(out), cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming the Tune experiment" in second.stdout
    assert "seed 1: " in second.stdout and "validation gap $" in second.stdout  # via Ray
    assert snapshot(out / "seed_0") == done  # not one file of the finished seed rewritten
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1]
    assert summary["training"]["0"]["resumed_from"] is None
    assert summary["training"]["1"]["resumed_from"] is not None
    assert summary["training"]["1"]["timesteps"] >= 8192


def test_grading_on_ray_writes_the_local_episodes_file(cluster, tmp_path):
    config = RunConfig(("finality_gate", "react", "tests/redteam/frames.py:Frames"),
                       seeds=(0, 1))
    grade(config, tmp_path / "local", workers=2, progress=False)
    use_backend("ray")
    try:
        grade(config, tmp_path / "ray", workers=2, progress=False)
    finally:
        use_backend("local")
    local = (tmp_path / "local" / "episodes.jsonl").read_bytes()
    assert local == (tmp_path / "ray" / "episodes.jsonl").read_bytes()
    assert local.count(b"\n") == 3 * 321 * 2


def test_the_eval_cli_grades_on_ray(cluster, tmp_path):
    from eval.__main__ import main as eval_cli
    try:
        assert eval_cli(["headline", "--backend", "ray", "--seeds", "1", "--no-progress",
                         "--policies", "finality_gate,sop", "--out", str(tmp_path / "h")]) == 0
    finally:
        use_backend("local")
    summary = json.loads((tmp_path / "h" / "summary.json").read_text())
    assert summary["policies"]["finality_gate"]["episodes"] == 321


def test_the_private_split_is_not_graded_on_ray(cluster, tmp_path):
    use_backend("ray")
    try:
        with pytest.raises(ValueError, match="does not grade the private split"):
            grade(RunConfig(("finality_gate",), split="private", master_seed=7, seeds=(0,)),
                  tmp_path / "private", progress=False)
    finally:
        use_backend("local")
    assert not (tmp_path / "private").exists()
