"""`examples/masked_ppo.py`, run as a practitioner runs it (a script, from the repository), at a
tiny budget: it trains on the native vector env, logs the graded validation to TensorBoard,
exports an ONNX graph that says what it was trained for, and grades it with `onnx:` beside the
gate on both splits; the same seed gives the same run."""

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agents.learned.trained_for import read_onnx
from eval.grading.runfolder import read_rows
from eval.stats.summary import by_policy

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--env-id", "FinalityNoProbe-v0", "--total-timesteps", "3000", "--num-envs", "4",
        "--num-steps", "128", "--minibatch-size", "128", "--update-epochs", "2",
        "--eval-every", "1024", "--grade-seeds", "1", "--workers", "1"]


def _run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "examples" / "masked_ppo.py"), *TINY,
                           "--out", str(out), *extra], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("example")
    return [(_run(base / name), base / name) for name in ("a", "b")]


def test_the_example_trains_exports_and_grades(runs):
    done, out = runs[0]
    assert done.returncode == 0, done.stderr[-3000:]
    history = [json.loads(line) for line in (out / "validation.jsonl").read_text().splitlines()]
    assert [h["timesteps"] for h in history] == [512, 1536, 2560, 3072]
    (events,) = (out / "tb").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    logged = {e.step: e.value for e in acc.Scalars("validation/mean_gap")}
    assert logged == pytest.approx({h["timesteps"]: h["mean_gap"] for h in history})
    result = json.loads((out / "result.json").read_text())
    assert result["timesteps"] == 3072
    assert result["best"] == min(history, key=lambda h: h["mean_gap"])
    trained = read_onnx(out / "model.onnx")
    assert (trained.env_id, trained.probe) == ("FinalityNoProbe-v0", "none")
    graph = onnx.load(str(out / "model.onnx"))
    assert [i.name for i in graph.graph.input] == ["obs", "action_mask"]
    for split in ("public", "regenerated"):
        summary = json.loads((out / f"eval_{split}" / "summary.json").read_text())
        rows = by_policy(read_rows(out / f"eval_{split}" / "episodes.jsonl"))
        spec = f"onnx:{out / 'model.onnx'}"
        assert set(rows) == {"finality_gate", spec} and len(rows[spec]) == 321
        assert summary["probe"] == "none"
        assert all(r["calls"] and all(c[1] != "probe_processor" for c in r["calls"])
                   for r in rows[spec])
    table = done.stdout[done.stdout.rindex("split regenerated"):]
    assert "finality_gate" in table and f"onnx:{out / 'model.onnx'}" in table


def test_the_same_seed_gives_the_same_run(runs):
    (a, out_a), (b, out_b) = runs
    assert a.returncode == b.returncode == 0
    assert (out_a / "validation.jsonl").read_text() == (out_b / "validation.jsonl").read_text()
    rows = [[{k: v for k, v in r.items() if k != "policy"}
             for r in read_rows(out / "eval_regenerated" / "episodes.jsonl")
             if r["policy"].startswith("onnx:")] for out in (out_a, out_b)]
    assert rows[0] == rows[1]


def test_the_example_refuses_a_used_folder_and_an_unknown_id(runs, tmp_path):
    _, out = runs[0]
    used = _run(out)
    assert used.returncode == 2 and "is not empty" in used.stderr
    unknown = subprocess.run([sys.executable, str(ROOT / "examples" / "masked_ppo.py"),
                              "--env-id", "CartPole-v1", "--out", str(tmp_path / "x")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert unknown.returncode == 2 and "unknown id 'CartPole-v1'" in unknown.stderr
    assert not (tmp_path / "x").exists()
