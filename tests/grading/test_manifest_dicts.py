"""`from_dict` beside every `to_dict` of what a run.json and a graded row hold (`FaultProfile`,
`Costs`, `EpisodeRecord`; `Task`'s is in test_corpus.py): through JSON and back to the very
object, and anything that is not one refused with the reason; and the results site, which reads
them this way, refusing a run.json whose world is not one before it writes anything."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.env.strategies import PUBLIC, calls, play, profiles, seeds, tasks

import eval.experiments.headline as headline
import eval.site.view as view
from agents import make_policy
from agents.registry import SCRIPTED
from eval.experiments.costs import configurations
from eval.grading.runfolder import read_rows, seal
from finality_gym import Costs, Episode, EpisodeRecord, FaultProfile
from finality_gym.faults import FAMILIES
from finality_gym.policy import play as play_policy


def _through_json(value: dict) -> dict:
    return json.loads(json.dumps(value))


def _same(a: tuple, b: tuple) -> bool:
    """Equal field by field and of the same types (True == 1, but a bool is not an int)."""
    return a == b and [type(x) for x in a] == [type(y) for y in b]


# ------------------------------------------------------------------ round trips
@given(profiles)
def test_a_fault_profile_comes_back_from_its_dict(profile):
    back = FaultProfile.from_dict(_through_json(profile.to_dict()))
    assert back == profile and back.thresholds == profile.thresholds
    assert back.to_dict() == profile.to_dict()


def test_the_named_fault_profiles_come_back_from_their_dicts():
    named = [FaultProfile(), FaultProfile.none(), *(FaultProfile.only(f) for f in FAMILIES),
             *(FaultProfile().without(f) for f in FAMILIES)]
    for profile in named:
        assert FaultProfile.from_dict(_through_json(profile.to_dict())) == profile


def test_the_cost_sweeps_costs_come_back_from_their_dicts():
    for costs in (*configurations(), Costs()):
        back = Costs.from_dict(_through_json(costs.to_dict()))
        assert back == costs and back.to_dict() == costs.to_dict()


@given(tasks, seeds, profiles, st.sampled_from(SCRIPTED), st.sampled_from(configurations()))
def test_a_played_episodes_record_comes_back_from_its_dict(task, seed, profile, name, costs):
    record = play_policy(make_policy(name), task, seed, faults=profile, costs=costs).record()
    back = EpisodeRecord.from_dict(_through_json(record.to_dict()))
    assert _same(back, record) and back.to_dict() == record.to_dict()


@given(tasks, seeds, profiles, calls)
def test_any_ended_episodes_record_comes_back_from_its_dict(task, seed, profile, sequence):
    """Calls at random, the episode closed if they did not end it: lapses and early ends."""
    episode = Episode(task, seed=seed, faults=profile)
    play(episode, sequence)
    if not episode.done:
        episode.call("close")
    record = episode.record()
    assert _same(EpisodeRecord.from_dict(_through_json(record.to_dict())), record)


# ------------------------------------------------------------------ refusals
def _record() -> dict:
    return play_policy(make_policy("finality_gate"), PUBLIC.tasks[0], 0).record().to_dict()


@pytest.mark.parametrize("data, reason", [
    ([0.3, ["loss"]], "is a dict"),
    ({"intensity": 0.3}, r"missing keys \['families'\]"),
    ({"intensity": 0.3, "families": [], "seed": 1}, r"unknown keys \['seed'\]"),
    ({"intensity": "0.3", "families": []}, "intensity must be a number"),
    ({"intensity": True, "families": []}, "intensity must be a number"),
    ({"intensity": 1.5, "families": []}, r"intensity must lie in \[0, 1\]"),
    ({"intensity": 0.3, "families": "loss"}, "families are a list of names"),
    ({"intensity": 0.3, "families": ["loss", 3]}, "families are a list of names"),
    ({"intensity": 0.3, "families": ["loss", "loss"]}, "name one twice"),
    ({"intensity": 0.3, "families": ["hail"]}, "unknown fault families"),
])
def test_what_is_not_a_fault_profile_is_refused_saying_why(data, reason):
    with pytest.raises(ValueError, match=reason):
        FaultProfile.from_dict(data)


@pytest.mark.parametrize("data, reason", [
    (None, "are a dict"),
    ({"cogs_fraction": 0.6, "dispute_fee": 2500}, r"missing keys \['escalation_fee'\]"),
    ({**Costs().to_dict(), "vat": 0.2}, r"unknown keys \['vat'\]"),
    ({**Costs().to_dict(), "dispute_fee": 2500.0}, "dispute_fee must be a non-negative int"),
    ({**Costs().to_dict(), "cogs_fraction": "0.6"}, "cogs_fraction must be a number"),
    ({**Costs().to_dict(), "escalation_fee": True}, "escalation_fee must be a non-negative"),
])
def test_what_is_not_costs_is_refused_saying_why(data, reason):
    with pytest.raises(ValueError, match=reason):
        Costs.from_dict(data)


@pytest.mark.parametrize("change, reason", [
    ({"policy": "react"}, r"unknown keys \['policy'\]"),
    ({"gap": 12.0}, "record's gap is int, got 12.0"),
    ({"lapsed": 0}, "record's lapsed is bool, got 0"),
    ({"seed": True}, "record's seed is int, got True"),
    ({"twin_id": 7}, r"record's twin_id is str \| None, got 7"),
    ({"tool_counts": {"wait": 1.5}}, "record's tool_counts counts ints by name"),
    ({"fault_firings": [["loss", 1]]}, "record's fault_firings is dict"),
])
def test_what_is_not_an_episode_record_is_refused_saying_why(change, reason):
    with pytest.raises(ValueError, match=reason):
        EpisodeRecord.from_dict({**_record(), **change})


def test_an_episode_record_missing_a_field_or_not_a_dict_is_refused():
    data = _record()
    del data["reference"]
    with pytest.raises(ValueError, match=r"missing keys \['reference'\]"):
        EpisodeRecord.from_dict(data)
    with pytest.raises(ValueError, match="is a dict"):
        EpisodeRecord.from_dict(list(_record().values()))


# ------------------------------------------------------------------ the site reads them so
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("results") / "headline"
    headline.run(out, workers=1, progress=False, seeds=1, policies=("finality_gate",),
                 tasks=tuple(t.task_id for t in PUBLIC.tasks[:2]), echo=False)
    return out


@pytest.mark.parametrize("key, value, reason", [
    ("faults", {"intensity": 0.3, "families": ["loss"], "extra": 1}, r"unknown keys \['extra'\]"),
    ("costs", {**Costs().to_dict(), "dispute_fee": 2500.5}, "dispute_fee must be"),
])
def test_the_site_refuses_a_run_json_whose_world_is_not_one(run, tmp_path, key, value, reason):
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    manifest = json.loads((folder / "run.json").read_text())
    (folder / "run.json").write_text(json.dumps({**manifest, key: value}))
    with pytest.raises(ValueError, match=re.escape(str(folder / "run.json")) + ".*" + reason):
        view.build([folder], tmp_path / "site", pictures="none")
    assert not (tmp_path / "site").exists()


def _replayed(site, task_id: str) -> list[str]:
    """What the site says of each episode of the task's file (`FG.put(KEY,JSON);`)."""
    text = (site / "data" / "0" / "tasks" / f"{task_id}.js").read_text()
    return [e["replayed"] for e in json.loads(text[text.index(",") + 1:-3])["episodes"]]


def test_the_site_compares_the_replayed_record_with_the_rows_by_type(run, tmp_path):
    """A row whose cash is 1000.0 where the engine's is 1000 is not the graded record: equal as
    numbers, but not what the grader wrote."""
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    rows = read_rows(folder / "episodes.jsonl")
    rows[0]["cash"] = float(rows[0]["cash"])
    (folder / "episodes.jsonl").write_text("".join(seal(r) + "\n" for r in rows))
    view.build([folder], tmp_path / "site", pictures="none")
    assert _replayed(tmp_path / "site", rows[0]["task_id"]) == [
        "the calls replay, but the row holds no episode record (an episode record's cash is "
        f"int, got {rows[0]['cash']!r})"]
    assert _replayed(tmp_path / "site", rows[1]["task_id"]) == ["ok"]
