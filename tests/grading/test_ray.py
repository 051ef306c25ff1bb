"""The Ray backends on a real embedded Ray (2 CPUs, started once for the test session's Ray
tests: they are one file, which `make test` runs on one worker, `--dist loadfile`): a sweep's trials
write what the local backend writes and its terminal shows the sweep's own lines only, a killed
sweep resumes through Tune's restore without redoing a finished seed, an interrupted one leaves
a state Tune restores, and the grader's chunks on Ray write the local episodes file."""

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
from ray import tune

from eval.grading.grader import Chunk, RunConfig, grade
from finality_gym.corpus import private_corpus
from train.__main__ import main as train_cli

from tests.training.test_sweep import TINY, Sweep, same_model, snapshot

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cluster():
    os.environ["RAY_worker_niceness"] = "0"  # as eval.grading.distributed.connect does for its own
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
    host and the time), Ray's own (`tune/`, `ray.log`) left out."""
    names = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and rel.parts[0] not in ("tune", "ray.log"):
            names.append(str(rel.parent / "events") if rel.name.startswith("events.out.")
                         else str(rel))
    return names


def _env(cluster: str) -> dict:
    """A sweep process's environment: it joins the test session's cluster."""
    return {**os.environ, "RAY_ADDRESS": cluster, "PYTHONPATH": str(ROOT)}


PROGRESS = (r"^seed [01]: +[\d,]+ steps +[\d,]+ steps/s  validation gap \$[\d.]+  "
            r"best \$[\d.]+ at [\d,]+$")


def test_a_ray_sweep_writes_what_a_local_sweep_writes_and_shows_its_own_lines(cluster,
                                                                               tmp_path):
    local, remote = tmp_path / "local", tmp_path / "ray"
    assert train_cli(["sweep", "--seeds", "0-1", "--out", str(local), *TINY]) == 0
    run = subprocess.run([sys.executable, "-m", "train", "sweep", "--seeds", "0-1", "--backend",
                          "ray", "--out", str(remote), *TINY], cwd=ROOT, env=_env(cluster),
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    # The terminal shows the sweep's own lines only, those of a local sweep: 3 validations and
    # a "done" line per seed, the aggregate's table; Ray's go to ray.log (Tune's checkpoint
    # notes, its snapshot warnings, the trials' output)
    assert run.stderr == ""
    lines = run.stdout.splitlines()
    assert lines[:2] == [f"sweep {remote}: 2 seeds (0 done), backend ray, 2 at a time",
                         f"Ray's own output: {remote / 'ray.log'}"]
    assert len([line for line in lines if re.match(PROGRESS, line)]) == 6
    assert sorted(line for line in lines if ": done, " in line) == [
        f"seed {k}: done, best validation gap ${best:.2f} at {steps:,} steps"
        for k in (0, 1) for best, steps in [_best(remote / f"seed_{k}")]]
    assert len([line for line in lines if line.startswith("|")]) == 5
    assert lines[-1].startswith("sweep of 2 seeds in ") and len(lines) == 16
    assert "Checkpoint successfully created" in (remote / "ray.log").read_text()
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


def _best(run: Path) -> tuple[float, int]:
    best = json.loads((run / "best.json").read_text())
    return best["mean_gap"], best["timesteps"]


def _sweep_args(out: Path) -> list[str]:
    return ["--backend", "ray", "--seeds", "0-1", "--workers", "1", "--out", str(out),
            *TINY[:1], "8192", *TINY[2:]]


def _sweep_command(out: Path) -> list[str]:
    return [sys.executable, "-m", "train", "sweep", *_sweep_args(out)]


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


def _trials_end(deadline: float) -> None:
    while _trial_processes():  # Ray ends the dead driver's trials
        assert time.monotonic() < deadline, "the sweep's trials live on"
        time.sleep(0.1)


def test_a_killed_ray_sweep_resumes_without_redoing_a_finished_seed(cluster, tmp_path):
    out = tmp_path / "sweep"
    env = _env(cluster)
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
    _trials_end(deadline)
    done = snapshot(out / "seed_0")
    assert (out / "seed_0" / "result.json") in done
    second = subprocess.run(_sweep_command(out), cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=240)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming the Tune experiment" in second.stdout
    assert "seed 1: " in second.stdout and "validation gap $" in second.stdout
    assert snapshot(out / "seed_0") == done  # not one file of the finished seed rewritten
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1]
    assert summary["training"]["0"]["resumed_from"] is None
    assert summary["training"]["1"]["resumed_from"] is not None
    assert summary["training"]["1"]["timesteps"] >= 8192


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_stops_a_ray_sweep_and_leaves_a_state_it_resumes(cluster, tmp_path, presses):
    """One Ctrl-C: Tune ends its trials and saves its state, then the sweep stops (it went on
    to a new experiment that trained every seed to its end); a second one, while Tune saves,
    skips that (it ended in a traceback and a stray experiment folder). After one press the
    saved state is one the sweep resumes (`Tuner.can_restore`, the sweep's own test before it
    restores; the restore itself, after a kill, is the test above's: rerunning it here cost a
    minute of CI for no other path)."""
    out = tmp_path / "sweep"
    command = ["--backend", "ray", "--seeds", "0-1", "--out", str(out), *TINY]
    sweep = Sweep(command, env=_env(cluster))
    sweep.wait_for(r"^seed [01]: +2 steps")
    for _ in range(presses):
        os.killpg(sweep.process.pid, signal.SIGINT)
        time.sleep(0.3)
    assert sweep.process.wait(timeout=120) == 130
    assert sweep.process.stderr.read() == "interrupted; re-run to resume\n"
    assert [p.name for p in (out / "tune").iterdir()] == ["seeds_0-1"]
    assert not list(out.glob("seed_*/result.json"))
    _trials_end(time.monotonic() + 60)
    if presses == 1:
        assert tune.Tuner.can_restore(str(out / "tune" / "seeds_0-1"))


def test_a_sweep_the_cluster_cannot_run_writes_nothing(cluster, tmp_path, capsys):
    """The cluster's CPUs are checked before the sweep folder is written: it was checked after
    sweep.json, and the folder then refused every other recipe."""
    out = tmp_path / "sweep"
    assert train_cli(["sweep", "--backend", "ray", "--torch-threads", "64", "--seeds", "0",
                      "--out", str(out), *TINY]) == 2
    assert capsys.readouterr().err == ("error: --torch-threads 64: a trial needs that many CPUs "
                                       "and the Ray cluster has 2\n")
    assert not out.exists()


def test_grading_on_ray_writes_the_local_episodes_file(cluster, tmp_path):
    config = RunConfig(("finality_gate", "react", "tests/sandbox/redteam/frames.py:Frames"),
                       seeds=(0, 1))
    grade(config, tmp_path / "local", workers=2, progress=False)
    grade(config, tmp_path / "ray", workers=2, progress=False, backend="ray")
    local = (tmp_path / "local" / "episodes.jsonl").read_bytes()
    assert local == (tmp_path / "ray" / "episodes.jsonl").read_bytes()
    assert local.count(b"\n") == 3 * 321 * 2
    # the sandbox proved itself on every node that graded (here, the one), recorded per node
    ray_run = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert list(ray_run["sandbox_nodes"].values()) == [ray_run["sandbox"]], ray_run
    assert "sandbox_nodes" not in json.loads((tmp_path / "local" / "run.json").read_text())


def test_the_eval_cli_grades_on_ray(cluster, tmp_path):
    from eval.__main__ import main as eval_cli
    assert eval_cli(["headline", "--backend", "ray", "--seeds", "1", "--no-progress",
                     "--policies", "finality_gate,sop", "--out", str(tmp_path / "h")]) == 0
    summary = json.loads((tmp_path / "h" / "summary.json").read_text())
    assert summary["policies"]["finality_gate"]["episodes"] == 321


def test_the_private_split_on_ray_sends_its_cases_never_its_seed(cluster, tmp_path):
    """A chunk as it travels to a Ray task holds the tasks it plays and not the master seed
    (it stays in the driver: a node sees the cases it grades); the file is the local one."""
    seed = 0x19af95c36892739c6fe61330c9efc9e00
    tasks = tuple(t.task_id for t in private_corpus(seed).tasks[:20])
    config = RunConfig(("finality_gate", "react"), split="private", master_seed=seed,
                       seeds=(0,), tasks=tasks)
    chunk = pickle.dumps(Chunk.of(config, config.jobs()[:10], {}))
    assert seed.to_bytes(17, "little") not in chunk and str(seed).encode() not in chunk
    assert pickle.dumps(config).count(seed.to_bytes(17, "little")) == 1  # (the check can see)
    assert tasks[0].encode() in chunk
    grade(config, tmp_path / "local", workers=2, progress=False)
    grade(config, tmp_path / "ray", workers=2, progress=False, backend="ray")
    local = (tmp_path / "local" / "episodes.jsonl").read_bytes()
    assert local == (tmp_path / "ray" / "episodes.jsonl").read_bytes()
    assert local.count(b"\n") == 40


def test_an_embedded_ray_gets_no_import_path_seed_or_key_of_the_driver(tmp_path):
    """The processes a Ray started here keeps for the whole run never see the driver's
    PYTHONPATH (a package bundle's folder: Ray's own imports would find its code, outside the
    sandbox), its master seed or a key; the driver's environment is as it was."""
    (tmp_path / "uvloop.py").write_text("raise SystemExit('a bundle ran in Ray')\n")
    # set as `eval.board.loading` sets it for a package bundle: in the running driver
    script = ("import os, ray; os.environ['PYTHONPATH'] = os.environ['EXPECTED']; "
              "from eval.grading.distributed import connect; connect(); "
              "print(ray.get(ray.remote(lambda: sorted(k for k in os.environ if k in "
              "('PYTHONPATH', 'FINALITY_MASTER_SEED', 'VENDOR_API_KEY'))).remote())); "
              "print(os.environ['PYTHONPATH'] == os.environ['EXPECTED'])")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env.update(EXPECTED=str(tmp_path), VENDOR_API_KEY="k", FINALITY_MASTER_SEED=str(2 ** 200))
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parents[2],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["[]", "True"]
