"""`python -m train search`: a short search over algorithms, judged on validation alone (the
runs are real SB3 training at a tiny size; tests/training/test_sweep.py covers resuming a killed
run)."""

import json
from pathlib import Path

import pytest

from train.__main__ import main as train_cli

TINY = ["--env", "FinalityDelayedProbe-v0", "--algos", "ppo,recurrent_ppo", "--timesteps", "1024",
        "--n-envs", "2", "--eval-every", "512", "--validation-stride", "32",
        "--checkpoint-every", "512"]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    out = tmp_path_factory.mktemp("search") / "search"
    assert train_cli(["search", *TINY, "--out", str(out)]) == 0
    return out


def _curve(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "validation.jsonl").read_text().splitlines()]


def test_a_search_trains_every_algorithm_and_chooses_on_validation_alone(searched):
    summary = json.loads((searched / "summary.json").read_text())
    assert summary["algos"] == ["ppo", "recurrent_ppo"] and summary["seeds"] == [0]
    means = {}
    for algo in ("ppo", "recurrent_ppo"):
        run = searched / algo / "seed_0"
        config = json.loads((run / "config.json").read_text())
        assert config["algo"] == algo and config["timesteps"] == 1024
        assert config["env"] == "FinalityDelayedProbe-v0"
        curve = _curve(run)
        assert [c["timesteps"] for c in curve] == [2, 514, 1024]
        entry = summary["algorithms"][algo]["runs"][0]
        assert entry["best_mean_gap"] == min(c["mean_gap"] for c in curve)
        assert entry["last_mean_gap"] == curve[-1]["mean_gap"]
        assert entry["curve"] == [[c["timesteps"], c["mean_gap"]] for c in curve]
        means[algo] = entry["best_mean_gap"]
        assert (run / "best_model.zip").is_file() and (run / "learning_curve.png").is_file()
    assert summary["chosen"] == min(means, key=means.get)
    # judged on validation alone: no run was graded, on any split
    assert not list(searched.rglob("eval_*")) and not list(searched.rglob("episodes.jsonl"))
    report = (searched / "report.md").read_text()
    assert f"Chosen: `{summary['chosen']}`" in report
    assert summary["machines"] and f"Trained on: {'; '.join(summary['machines'])}." in report
    for algo in means:
        assert f"{means[algo]:.2f}" in report
    assert (searched / "search.png").read_bytes()[:4] == b"\x89PNG"


def test_rerunning_a_search_trains_nothing_and_another_search_is_refused(searched, capsys):
    results = {p: p.stat().st_mtime_ns for p in searched.rglob("result.json")}
    assert train_cli(["search", *TINY, "--out", str(searched)]) == 0
    assert "(2 of 2 runs done)" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in searched.rglob("result.json")} == results
    before = sorted((p, p.stat().st_mtime_ns) for p in searched.rglob("*") if p.is_file())
    other = [a if a != "1024" else "2048" for a in TINY]
    assert train_cli(["search", *other, "--out", str(searched)]) == 2
    err = capsys.readouterr().err
    assert "holds another search (differs in shared)" in err
    assert sorted((p, p.stat().st_mtime_ns) for p in searched.rglob("*") if p.is_file()) == before


@pytest.mark.parametrize("algos, message", [
    ("ppo,sac", "unknown algorithm 'sac'"),
    ("ppo,ppo", "names an algorithm twice"),
    ("ppo", "at least two algorithms"),
])
def test_bad_algorithm_lists_are_refused_before_anything_is_written(algos, message, tmp_path,
                                                                    capsys):
    out = tmp_path / "search"
    assert train_cli(["search", "--algos", algos, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_a_search_takes_no_algorithm_hyperparameters(tmp_path, capsys):
    """Each algorithm trains with its own defaults: an option only some take is no option."""
    with pytest.raises(SystemExit):
        train_cli(["search", "--learning-rate", "0.001", "--out", str(tmp_path / "s")])
    assert "unrecognized arguments: --learning-rate" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_a_folder_holding_something_else_is_refused(tmp_path, capsys):
    out = tmp_path / "search"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert train_cli(["search", *TINY, "--out", str(out)]) == 2
    assert "holds no search.json" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
