"""Offline RL: `env:RULE` (a rule as a policy of the env's actions), `python -m train dataset`
(a Minari dataset of their decisions, with reference scores) and `python -m train offline`
(behaviour cloning and Tianshou's discrete CQL from it, exported and graded)."""

import dataclasses
import json

import gymnasium as gym
import minari
import numpy as np
import onnx
import pytest

import finality_gym
from agents import make_policy
from agents.learned.trained_for import read_onnx
from agents.registry import HEADLINE
from agents.scripted.env_actions import env_wait
from finality_gym.policy import play
from eval.grading.grader import RunConfig, grade_in_process
from eval.grading.runfolder import read_rows
from eval.stats.summary import by_policy
from train.__main__ import main as train_cli
from train.dataset import FAMILIES, DatasetConfig, build
from train.offline import OfflineConfig, offline

NUMERIC_INFO = {"action_mask", "t", "calls_used", "order_value", "ended", "gap", "exact"}
TASKS = tuple(t.task_id for t in finality_gym.load_corpus("public").tasks[:12])
TINY = DatasetConfig("medium", arm="none", seeds=(0, 1), tasks=TASKS)


def _grade(spec: str, arm: str, cases) -> dict:
    """The shared grader's row of `spec` for each (task, seed)."""
    rows = {}
    for seed in sorted({s for _, s in cases}):
        tasks = tuple(t for t, s in cases if s == seed)
        for row in grade_in_process(make_policy(spec), spec, RunConfig(
                (spec,), split="public", seeds=(seed,), probe=arm, tasks=tasks)):
            rows[(row["task_id"], row["seed"])] = row
    return rows


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("datasets")
    build(TINY, folder / "a")
    build(TINY, folder / "b")
    return folder


def _load(folder, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(folder))
    return minari.load_dataset(TINY.dataset_id)


def test_env_actions_wait_as_the_env_can_and_grade_beside_the_rules():
    """Waits map to the longest env wait not past them; shorter than 10 ticks, none. Every
    call of an `env:` policy is one of the env's actions; its mean gap stays within $5 of the
    rule's (on regenerated, where the gate's short waits before the deadline differ)."""
    assert [env_wait(t) for t in (4, 10, 37, 60, 119, 500)] == [None, 10, 30, 60, 60, 120]
    corpus = finality_gym.load_corpus("regenerated")
    allowed = {("wait", 10), ("wait", 30), ("wait", 60), ("wait", 120)}
    gate, env_gate = [], []
    for task in corpus.tasks[:80]:
        for spec, gaps in (("finality_gate", gate), ("env:finality_gate", env_gate)):
            episode = play(make_policy(spec), task, 0)
            gaps.append(episode.record().gap)
            if spec.startswith("env:"):
                assert all(args.get("ticks", 10) in {w for _, w in allowed}
                           for _, tool, args, _ in episode.history if tool == "wait")
    assert abs(np.mean(gate) - np.mean(env_gate)) / 100 < 5
    with pytest.raises(ValueError, match="a privileged policy acts on the truth"):
        make_policy("env:finality_oracle")
    with pytest.raises(ValueError, match="env: takes a rule or a plan"):
        make_policy("env:onnx:x.onnx")


def test_the_dataset_holds_the_graders_episodes_and_reference_scores(built, monkeypatch):
    dataset = _load(built / "a", monkeypatch)
    env = gym.make("FinalityNoProbe-v0")
    assert dataset.observation_space == env.observation_space
    assert dataset.action_space == env.action_space
    episodes = TINY.episodes()
    assert dataset.total_episodes == len(episodes) == 24
    assert [p for p, _, _ in episodes[:4]] == ["react", "reflection", "react", "reflection"]
    rows = {spec: _grade(f"env:{spec}", "none", [(t, s) for p, t, s in episodes if p == spec])
            for spec in FAMILIES["medium"]}
    for episode, (spec, task, seed) in zip(dataset.iterate_episodes(), episodes):
        row = rows[spec][(task, seed)]
        assert set(episode.infos) == NUMERIC_INFO
        steps = len(episode.actions)
        assert episode.infos["action_mask"].shape == (steps + 1, 16)
        assert not episode.infos["action_mask"][:, 4].any()  # the no-probe arm's mask
        assert int(episode.infos["gap"][-1]) == row["gap"] and episode.infos["ended"][-1]
        assert episode.rewards.sum() == pytest.approx(-row["gap"] / 100 / 100)
        assert steps == len(row["calls"])
    meta = dataset.storage.metadata
    cases = [(t, s) for _, t, s in episodes]
    random_gap = np.mean([r["gap"] for r in _grade("random", "none", cases).values()]) / 100
    assert meta["ref_min_score"] == pytest.approx(-random_gap / 100)
    assert meta["ref_max_score"] == 0.0
    ours = meta["finality_gym"]
    assert ours["policies"] == ["env:react", "env:reflection"] and ours["arm"] == "none"
    assert ours["split_fingerprint"] == finality_gym.load_corpus("public").fingerprint
    assert ours["ref_min_gap"] == pytest.approx(random_gap) and ours["ref_max_gap"] == 0.0
    normalized = minari.get_normalized_score(dataset, np.array([meta["ref_min_score"], 0.0]))
    assert normalized == pytest.approx([0.0, 1.0])


def test_the_same_command_writes_the_same_bytes(built):
    a, b = built / "a", built / "b"
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert any(p.suffix == ".hdf5" for p in files)
    for path in files:
        assert (a / path).read_bytes() == (b / path).read_bytes(), path


def test_bad_datasets_are_refused(built, capsys):
    with pytest.raises(ValueError, match="family: unknown family 'best'"):
        DatasetConfig("best")
    with pytest.raises(ValueError, match="a privileged policy acts on the truth"):
        DatasetConfig("own", policies=("finality_oracle",))
    with pytest.raises(ValueError, match="exists: pick another --out"):
        build(TINY, built / "a")
    assert train_cli(["dataset", "--family", "expert", "--arm", "partial", "--out",
                      str(built / "c")]) == 2
    assert "arm: unknown probe arm 'partial'" in capsys.readouterr().err
    assert not (built / "c").exists()


@pytest.mark.parametrize("algo, output", [("bc", "logits"), ("cql", "q_values")])
def test_offline_baselines_train_export_and_grade(built, tmp_path, algo, output):
    """A tiny run of each algorithm on the tiny dataset: its graph (masked, the dataset's arm in
    its metadata) graded beside the nine and the policies that made the data, on the dataset's
    arm; validated; the same seed gives the same graph."""
    config = OfflineConfig(TINY.dataset_id, str(built / "a"), str(tmp_path / "run"), algo=algo,
                           epochs=3, grade_seeds=1, workers=1)
    result = offline(config)
    assert result["transitions"] > 24 and result["episodes"] == 24
    assert result["best"]["episodes"] == 161 and result["best"]["mean_gap"] > 0
    history = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").open()]
    assert [h["epoch"] for h in history] == [1, 2, 3]
    graph = onnx.load(str(tmp_path / "run" / "model.onnx"))
    assert [i.name for i in graph.graph.input] == ["obs", "action_mask"]
    assert [o.name for o in graph.graph.output] == [output]
    assert read_onnx(tmp_path / "run" / "model.onnx").probe == "none"
    rows = by_policy(read_rows(tmp_path / "run" / "eval_regenerated" / "episodes.jsonl"))
    spec = f"onnx:{tmp_path / 'run' / 'model.onnx'}"
    assert set(rows) == set(HEADLINE) | {"env:react", "env:reflection", spec}
    assert all(c[1] != "probe_processor" for r in rows[spec] for c in r["calls"])
    summary = json.loads((tmp_path / "run" / "eval_regenerated" / "summary.json").read_text())
    assert summary["probe"] == "none"
    again = offline(dataclasses.replace(config, out=str(tmp_path / "again")))
    assert again["transitions"] == result["transitions"]
    assert (tmp_path / "again" / "model.onnx").read_bytes() == \
        (tmp_path / "run" / "model.onnx").read_bytes()
    with pytest.raises(ValueError, match="algo: unknown algorithm 'iql'"):
        dataclasses.replace(config, algo="iql")


def test_a_recorded_action_the_mask_forbade_is_left_out_of_the_loss(tmp_path):
    """On the no-probe arm the gate probes every round, refused: real transitions whose action
    the mask forbids. BC keeps them out of its loss (a masked logit would put it at 1e8)."""
    config = DatasetConfig("expert", arm="none", seeds=(0,), tasks=TASKS[:6])
    build(config, tmp_path / "ds")
    result = offline(OfflineConfig(config.dataset_id, str(tmp_path / "ds"), str(tmp_path / "bc"),
                                   epochs=2, grade_seeds=1, workers=1))
    assert 0 < result["masked_actions"] < result["transitions"]
    history = [json.loads(line) for line in (tmp_path / "bc" / "history.jsonl").open()]
    assert all(h["loss"] < 10 for h in history)
