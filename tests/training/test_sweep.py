"""`python -m train sweep` with the local backend: layout, aggregate, resume, reproducibility,
Ctrl-C and a killed sweep. (The Ray backend is in tests/grading/test_ray.py; this module never
imports Ray.)"""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from eval.grading.runfolder import lock, read_rows
from train.__main__ import main as train_cli
from train.config import TrainConfig
from train.run import train
from train.sweep import check, parse_seeds, sweep


TINY = ["--timesteps", "2048", "--n-envs", "2", "--n-steps", "256", "--batch-size", "256",
        "--n-epochs", "2", "--eval-every", "1024", "--validation-stride", "32",
        "--checkpoint-every", "1024", "--final-seeds", "1"]
TINY_CONFIG = TrainConfig(timesteps=2048, n_envs=2, n_steps=256, batch_size=256, n_epochs=2,
                        eval_every=1024, validation_stride=32, checkpoint_every=1024,
                        final_seeds=1)


def parameters(path: Path) -> list[torch.Tensor]:
    from stable_baselines3 import PPO
    return [p.detach().clone() for p in PPO.load(path, device="cpu").policy.parameters()]


def same_model(a: Path, b: Path) -> bool:
    first, second = parameters(a), parameters(b)
    assert len(first) == len(second) > 0
    return all(torch.equal(x, y) for x, y in zip(first, second))


def snapshot(folder: Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    assert train_cli(["sweep", "--seeds", "0-1", "--workers", "2", "--out", str(out), *TINY]) == 0
    return out


def test_a_sweep_writes_every_seed_run_and_the_aggregate(swept, capsys):
    assert json.loads((swept / "sweep.json").read_text())["seeds"] == [0, 1]
    for seed in (0, 1):
        run = swept / f"seed_{seed}"
        config = json.loads((run / "config.json").read_text())
        assert config["seed"] == seed and config["torch_threads"] == 1
        for name in ("best_model.zip", "best.json", "validation.jsonl", "learning_curve.png",
                     "result.json", "eval_public/summary.json", "eval_regenerated/summary.json"):
            assert (run / name).is_file(), name
        assert list((run / "tb").rglob("events.out.tfevents.*"))
    summary = json.loads((swept / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and set(summary["splits"]) == {"regenerated", "public"}
    for split in summary["splits"].values():
        assert split["best_scripted"] == "finality_gate"
        assert [row["seed"] for row in split["seeds"]] == [0, 1]
        a = split["across_seeds"]
        # the across-seed mean is the mean of the seeds' means (same episodes for every seed)
        assert a["mean_gap"] == pytest.approx(sum(r["mean_gap"] for r in split["seeds"]) / 2,
                                              abs=1e-5)
        assert a["mean_gap_ci"][0] <= a["mean_gap"] <= a["mean_gap_ci"][1]
        assert a["vs_best_scripted"] == pytest.approx(
            a["mean_gap"] - split["scripted"]["finality_gate"]["mean_gap"], abs=1e-5)
        # a tiny run is far worse than the gate: no seed improves on it
        assert a["probability_of_improvement"] == 0 and a["seeds_at_or_below_best_scripted"] == 0
    # the per-seed numbers are those of the seed's own headline grading
    own = json.loads((swept / "seed_1" / "eval_regenerated" / "summary.json").read_text())
    spec = f"ppo:{(swept / 'seed_1').resolve() / 'best_model.zip'}"
    assert summary["splits"]["regenerated"]["seeds"][1]["mean_gap"] == pytest.approx(
        own["policies"][spec]["mean_gap"])
    assert (swept / "seeds.png").read_bytes()[:4] == b"\x89PNG"
    report = (swept / "report.md").read_text()
    assert "| **all** |" in report and "Probability of improvement" in report


def test_the_summary_carries_each_seeds_per_unit_scores_on_the_splits_units(swept):
    """`per_unit`: seeds x units arrays whose units are every unit of the split, as its corpus
    lists them, and whose `episodes`-weighted rows are the seeds' mean gaps and exact rates."""
    import numpy as np
    from finality_gym import load_corpus
    summary = json.loads((swept / "summary.json").read_text())
    for name, split in summary["splits"].items():
        corpus = load_corpus(name)
        p = split["per_unit"]
        assert p["units"] == [u[0].twin_id or u[0].task_id for u in corpus.units]
        assert len(set(p["units"])) == split["units"] == len(corpus.units)
        # one grading seed (--final-seeds 1): a twin pair's two halves, a singleton's one
        assert p["episodes"] == [len(u) for u in corpus.units]
        for key in ("mean_gap", "exact"):
            scores = np.array([p[key][str(row["seed"])] for row in split["seeds"]])
            assert scores.shape == (2, len(corpus.units))
            assert np.average(scores, axis=1, weights=p["episodes"]) == pytest.approx(
                [row[key] for row in split["seeds"]], abs=1e-5)
        assert set(p["scripted"]) == set(split["scripted"])
        gate = p["scripted"]["finality_gate"]["mean_gap"]
        assert np.average(gate, weights=p["episodes"]) == pytest.approx(
            split["scripted"]["finality_gate"]["mean_gap"], abs=1e-5)


def test_a_seed_trains_to_the_same_model_in_any_process(swept, tmp_path):
    """Seed 1 trained in a sweep worker (spawned, beside seed 0) and here, in this process."""
    config = TrainConfig(**{**TINY_CONFIG.__dict__, "seed": 1, "out": str(tmp_path / "again")})
    train(config, grading_workers=1, label="again: ")
    first, second = swept / "seed_1", tmp_path / "again"
    assert same_model(first / "best_model.zip", second / "best_model.zip")
    assert (first / "validation.jsonl").read_text() == (second / "validation.jsonl").read_text()
    mine = [{k: v for k, v in r.items() if k != "policy"}
            for r in read_rows(second / "eval_regenerated" / "episodes.jsonl")]
    theirs = [{k: v for k, v in r.items() if k != "policy"}
              for r in read_rows(first / "eval_regenerated" / "episodes.jsonl")]
    assert mine == theirs
    # and a different seed does not
    assert not same_model(swept / "seed_0" / "checkpoints" / "ppo_2048_steps.zip",
                          first / "checkpoints" / "ppo_2048_steps.zip")


def test_rerunning_a_finished_sweep_trains_nothing_and_adding_seeds_keeps_the_old(
        swept, tmp_path, capfd):
    import shutil
    out = tmp_path / "sweep"
    shutil.copytree(swept, out)
    before = snapshot(out / "seed_0")
    assert train_cli(["sweep", "--seeds", "0-1", "--out", str(out), *TINY]) == 0
    assert "2 seeds (2 done)" in capfd.readouterr().out
    assert snapshot(out / "seed_0") == before
    # a seed killed before its first checkpoint starts again; one killed after it resumes
    (out / "seed_1" / "result.json").unlink()
    shutil.rmtree(out / "seed_1" / "checkpoints")
    assert train_cli(["sweep", "--seeds", "1,2", "--out", str(out), *TINY]) == 0
    assert json.loads((out / "sweep.json").read_text())["seeds"] == [0, 1, 2]
    progress = capfd.readouterr().out  # the workers' lines: steps, steps/s, validation gap
    assert re.search(r"^seed 2: +1,026 steps +[\d,]+ steps/s  validation gap \$[\d.]+", progress,
                     re.MULTILINE), progress
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"] == [0, 1, 2] and snapshot(out / "seed_0") == before
    assert summary["training"]["1"]["resumed_from"] is None
    fresh = json.loads((out / "seed_1" / "result.json").read_text())
    assert fresh["best"] == json.loads((swept / "seed_1" / "result.json").read_text())["best"]


def _validations(run: Path) -> list[int]:
    return [json.loads(line)["timesteps"] for line in
            (run / "validation.jsonl").read_text().splitlines()]


def test_seeds_killed_after_a_checkpoint_resume_from_it(swept, tmp_path):
    """Seed 0 killed after its last checkpoint, before the final validation (and a checkpoint
    cut short beside it); seed 1 killed between its two checkpoints."""
    import shutil
    out = tmp_path / "sweep"
    shutil.copytree(swept, out)
    zero, one = out / "seed_0", out / "seed_1"
    for run in (zero, one):
        (run / "result.json").unlink()
        lines = (run / "validation.jsonl").read_text().splitlines()
        (run / "validation.jsonl").write_text("\n".join(lines[:-1]) + "\n")
    (zero / "checkpoints" / "ppo_4096_steps.zip").write_bytes(b"PK\x03\x04 torn")
    (one / "checkpoints" / "ppo_2048_steps.zip").unlink()
    assert _validations(zero)[-1] < 2048
    assert train_cli(["sweep", "--seeds", "0-1", "--out", str(out), *TINY]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["training"]["0"]["resumed_from"] == 2048  # the torn 4096 was passed over
    assert summary["training"]["1"]["resumed_from"] == 1024
    assert _validations(zero) == [2, 1026, 2048]  # the missed final validation, run on resume
    # seed 1 counts from its last validation (1026), not from its checkpoint (1024): no second
    # validation at its first step
    assert _validations(one) == [2, 1026, 2048]
    for run in (zero, one):
        assert json.loads((run / "result.json").read_text())["timesteps"] == 2048
        assert (run / "eval_regenerated" / "summary.json").is_file()


def test_a_seed_being_trained_elsewhere_is_refused(swept, tmp_path, capfd):
    import shutil
    out = tmp_path / "sweep"
    shutil.copytree(swept, out)
    (out / "seed_1" / "result.json").unlink()
    before = snapshot(out / "seed_1")
    with lock(out / "seed_1"):  # as a killed sweep's orphaned worker would hold it
        assert train_cli(["sweep", "--seeds", "0-1", "--out", str(out), *TINY]) == 2
    error = capfd.readouterr().err
    assert f"{(out / 'seed_1').resolve()} is being written by another run" in error
    assert {p: v for p, v in snapshot(out / "seed_1").items() if p.name != ".lock"} == {
        p: v for p, v in before.items() if p.name != ".lock"}


def test_a_sweep_folder_keeps_its_recipe(swept, tmp_path, capsys):
    import shutil
    out = tmp_path / "sweep"
    shutil.copytree(swept, out)
    before = snapshot(out)
    assert train_cli(["sweep", "--seeds", "0-1", "--out", str(out), *TINY[:-2],
                      "--final-seeds", "2", "--ent-coef", "0.02"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {out} holds a sweep of another recipe (differs in ent_coef, "
                            "final_seeds)") and len(error.splitlines()) == 1
    assert snapshot(out) == before
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not empty and holds no sweep.json"):
        check(TINY_CONFIG, (0,), stray)
    assert [p.name for p in stray.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize("text, message", [
    ("3-1", "3-1 runs backwards; write 1-3"), ("a", "not a seed"), ("-2", "not a seed"),
    ("0-200", "at most 100"),
    ("0-99999999999", "not a range of seeds in 0..2"), ("0-60,100-160", "at most 100"),
    (str(2**32), "not a range of seeds in 0..2"),
])
def test_bad_seed_lists_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_seeds(text)


def test_seed_lists():
    assert parse_seeds("0-4") == (0, 1, 2, 3, 4)
    assert parse_seeds("7, 0-2,1") == (0, 1, 2, 7)


def test_bad_sweep_options_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="unknown backend 'slurm'"):
        sweep(TINY_CONFIG, (0,), tmp_path / "a", backend="slurm")
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        sweep(TINY_CONFIG, (0,), tmp_path / "b", workers=0)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_nothing_but_the_ray_backends_imports_ray():
    code = ("import sys, finality_gym, agents, eval.__main__, train.__main__, train.sweep, "
            "eval.sweeps.aggregate, eval.grading.grader; "
            "from train.__main__ import main; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"


def test_without_ray_the_ray_backends_are_a_clear_error_that_writes_nothing(tmp_path):
    out = tmp_path / "sweep"
    code = ("import sys; sys.modules['ray'] = None\n"  # an installation without the extra
            "from train.__main__ import main as train\n"
            "from eval.__main__ import main as evaluate\n"
            f"print(train(['sweep', '--backend', 'ray', '--out', {str(out)!r}]))\n"
            f"print(evaluate(['headline', '--backend', 'ray', '--out', {str(out)!r}]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.stdout.split() == ["2", "2"], run.stderr
    errors = run.stderr.splitlines()
    assert len(errors) == 2 and all(e.startswith("error: --backend ray needs Ray") and
                                    "'.[ray]'" in e for e in errors), errors
    assert not out.exists()


def test_the_sweep_has_its_own_help_and_names_its_backends(capsys):
    with pytest.raises(SystemExit):
        train_cli(["sweep", "--help"])
    text = capsys.readouterr().out
    assert "training steps of each seed" in text and "--resume" not in text
    assert "--backend {local,ray}" in text
    with pytest.raises(SystemExit):
        train_cli(["sweep", "--backend", "slurm", "--out", "never"])
    assert "invalid choice: 'slurm'" in capsys.readouterr().err
    assert not Path("never").exists()


def test_an_out_folder_under_a_file_is_a_one_line_error(tmp_path, capsys):
    file = tmp_path / "somefile"
    file.write_text("mine")
    assert train_cli(["sweep", "--seeds", "0", "--out", str(file / "x"), *TINY]) == 2
    assert capsys.readouterr().err == f"error: --out {file / 'x'}: {file} is a file, not a folder\n"
    assert file.read_text() == "mine"


# ------------------------------------------------------------ Ctrl-C, and a killed sweep
ROOT = Path(__file__).resolve().parents[2]
LONGER = ["--timesteps", "4096", *TINY[2:]]


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C's default action, whatever this process inherited: an ignored SIGINT survives
    exec (Python then installs no handler), and something in a pytest worker may have left it
    ignored (the test of `train ppo`'s own Ctrl-C once did: the sweep never saw the signal)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Sweep:
    """`python -m train sweep` in a process group of its own, with SIGINT's default action (as
    a terminal runs it), its stdout read line by line as it comes."""

    def __init__(self, args: list[str], env: dict | None = None):
        self.process = subprocess.Popen([sys.executable, "-m", "train", "sweep", *args],
                                        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True, env=env,
                                        preexec_fn=_as_a_terminal_starts_it)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, *patterns: str, timeout: float = 300) -> None:
        """Until every pattern has matched a line of stdout."""
        deadline = time.monotonic() + timeout
        while not all(any(re.search(p, line) for line in self.seen) for p in patterns):
            try:
                self.seen.append(self.lines.get(timeout=max(deadline - time.monotonic(), 0)))
            except queue.Empty:
                raise AssertionError(f"no {patterns} in {self.seen}; "
                                     f"exit {self.process.poll()}") from None


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    return found


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie that waits for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_soon(pids: list[int], seconds: float = 5) -> None:
    deadline = time.monotonic() + seconds
    while living := [pid for pid in pids if alive(pid)]:
        assert time.monotonic() < deadline, f"processes {living} live on"
        time.sleep(0.1)


def test_ctrl_c_stops_a_local_sweep_with_a_hint_and_no_traceback(tmp_path):
    out = tmp_path / "sweep"
    sweep = Sweep(["--seeds", "0-1", "--workers", "2", "--out", str(out), *LONGER])
    sweep.wait_for(r"^seed \d: +2 steps")
    workers = children(sweep.process.pid)
    assert len(workers) >= 2
    os.killpg(sweep.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    assert sweep.process.wait(timeout=60) == 130
    assert sweep.process.stderr.read() == "interrupted; re-run to resume\n"
    gone_soon(workers)  # the seeds do not train on
    assert not list(out.glob("seed_*/result.json"))


def test_a_killed_sweep_takes_its_workers_with_it_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "sweep"
    command = ["--seeds", "0-1", "--workers", "2", "--out", str(out), *LONGER]
    sweep = Sweep(command)
    # both seeds past their first checkpoint (1024 steps; a validation follows it at 1026)
    sweep.wait_for(r"^seed 0: +1,026 steps", r"^seed 1: +1,026 steps")
    workers = children(sweep.process.pid)
    assert len(workers) >= 2
    sweep.process.kill()
    sweep.process.wait()
    gone_soon(workers)
    rerun = subprocess.run([sys.executable, "-m", "train", "sweep", *command], cwd=ROOT,
                           capture_output=True, text=True, timeout=1200)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    for seed in ("0", "1"):
        # from a checkpoint, not from scratch: whichever the seed had reached when the sweep
        # was killed (one seed may run well ahead of the other that the kill waits for)
        assert summary["training"][seed]["resumed_from"] in (1024, 2048, 3072)
        assert summary["training"][seed]["timesteps"] == 4096
        steps = _validations(out / f"seed_{seed}")
        assert steps == sorted(set(steps)) and steps[:2] == [2, 1026] and steps[-1] == 4096
