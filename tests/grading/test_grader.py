"""The shared grader: serial equals parallel, resume after a kill, bad runs, the headline CLI."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import finality_gym
from eval.grading.grader import RunConfig, grade
from eval.grading.runfolder import read_rows

ROOT = Path(__file__).resolve().parents[2]
TASKS = tuple(t.task_id for t in finality_gym.load_corpus("public").tasks[::8])
CONFIG = RunConfig(policies=("eager", "react", "finality_gate"), seeds=(0, 1), tasks=TASKS)


def test_serial_equals_parallel(tmp_path):
    serial = grade(CONFIG, tmp_path / "serial", workers=1, progress=False)
    parallel = grade(CONFIG, tmp_path / "parallel", workers=2, progress=False)
    assert serial == parallel and len(serial) == len(CONFIG.jobs())
    a = (tmp_path / "serial" / "episodes.jsonl").read_bytes()
    assert a == (tmp_path / "parallel" / "episodes.jsonl").read_bytes()


def test_resume_after_a_torn_write_loses_and_duplicates_nothing(tmp_path):
    full = grade(CONFIG, tmp_path / "full", workers=1, progress=False)
    out = tmp_path / "torn"
    grade(CONFIG, out, workers=1, progress=False)
    path = out / "episodes.jsonl"
    data = path.read_bytes()
    cut = data.index(b"\n", len(data) // 3) + 25  # keep a third, then half a line
    path.write_bytes(data[:cut])
    resumed = grade(CONFIG, out, workers=2, progress=False)
    keys = [(r["policy"], r["task_id"], r["seed"]) for r in read_rows(path)]
    assert len(keys) == len(set(keys)) == len(CONFIG.jobs())
    key = lambda r: (r["policy"], r["task_id"], r["seed"])  # noqa: E731
    assert sorted(resumed, key=key) == sorted(full, key=key)


def test_resume_after_a_killed_headline_run(tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "eval", "headline", "--out", str(out), "--workers", "1",
           "--no-progress", "--seeds", "3"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = out / "episodes.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and (not path.exists() or path.stat().st_size < 20_000):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(read_rows(path))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = read_rows(path)
    keys = {(r["policy"], r["task_id"], r["seed"]) for r in rows}
    assert len(rows) == len(keys) == 9 * 321 * 3
    assert 0 < partial < len(rows)
    grade(RunConfig(policies=("sop",), seeds=(0, 1, 2)), tmp_path / "fresh", workers=1,
          progress=False)
    fresh = read_rows(tmp_path / "fresh" / "episodes.jsonl")  # whole, with their calls
    assert sorted(map(json.dumps, fresh)) == sorted(json.dumps(r) for r in rows
                                                    if r["policy"] == "sop")


def test_a_different_configuration_in_the_same_folder_is_refused(tmp_path):
    grade(CONFIG, tmp_path, workers=1, progress=False)
    other = RunConfig(policies=CONFIG.policies, seeds=CONFIG.seeds, tasks=TASKS, probe="none")
    with pytest.raises(ValueError, match="different configuration \\(probe\\)"):
        grade(other, tmp_path, workers=1, progress=False)
    more = RunConfig(policies=CONFIG.policies + ("sop",), seeds=CONFIG.seeds, tasks=TASKS)
    assert len(grade(more, tmp_path, workers=1, progress=False)) == len(more.jobs())


def test_a_corrupt_line_is_a_clear_error(tmp_path):
    grade(CONFIG, tmp_path, workers=1, progress=False)
    path = tmp_path / "episodes.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = "{garbage"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="episodes.jsonl:4 is not a JSON record"):
        grade(CONFIG, tmp_path, workers=1, progress=False)


@pytest.mark.parametrize("kwargs,message", [
    ({"policies": ()}, "name at least one policy"),
    ({"policies": ("eager", "eager")}, "duplicates"),
    ({"policies": ("eager",), "seeds": (-1,)}, "seeds"),
    ({"policies": ("eager",), "probe": "x"}, "unknown arm"),
    ({"policies": ("eager",), "split": "x"}, "unknown split"),
    ({"policies": ("eager",), "tasks": ("nope",)}, "no task 'nope'"),
])
def test_bad_run_configs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RunConfig(**kwargs)


def test_unknown_policy_fails_before_anything_runs(tmp_path):
    with pytest.raises(ValueError, match="unknown policy 'psychic'"):
        grade(RunConfig(policies=("psychic",)), tmp_path, workers=1, progress=False)
    assert not (tmp_path / "episodes.jsonl").exists()


def test_headline_cli_writes_every_artefact(tmp_path):
    out = tmp_path / "h"
    done = subprocess.run([sys.executable, "-m", "eval", "headline", "--seeds", "2", "--policies",
                           "eager,finality_gate,finality_oracle", "--out", str(out),
                           "--no-progress"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert finality_gym.load_corpus("public").fingerprint in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 3 * 321 * 2
    for name in ("eager", "finality_gate", "finality_oracle"):
        p = summary["policies"][name]
        for key in ("exact", "exact_ci", "mean_gap", "mean_gap_ci", "pass_k", "paired",
                    "premature", "per_archetype", "loss_breakdown", "failure_labels"):
            assert key in p
        assert len(p["pass_k"]) == 2 and set(p["paired"]) >= {"settle", "fail", "average"}
        assert p["exact_ci"][0] <= p["exact"] <= p["exact_ci"][1]
    assert summary["policies"]["finality_oracle"]["mean_gap"] == 0
    for png in ("exact_vs_pass.png", "paired_halves.png"):
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    report = (out / "report.md").read_text()
    assert "| finality_gate |" in report and "pass^2" in report
    bad = subprocess.run([sys.executable, "-m", "eval", "headline", "--policies", "psychic",
                          "--out", str(tmp_path / "x")], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown policy 'psychic'" in bad.stderr
