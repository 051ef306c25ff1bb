"""The timeline's fault marks: once a case has ended, each system's track marks the deliveries
and reads a profile fault changed, named by family, exactly as the record's `fault_firings`
counts them; while the case runs they are ground truth the agent does not have, and nothing of
them shows."""

import copy
import re
from collections import Counter

import gymnasium as gym
import numpy as np
import pytest

import finality_gym
from finality_gym import Episode, FaultProfile, caseviews, timeline

PUBLIC = finality_gym.load_corpus("public")
ROUNDS = (["read_processor", "read_ledger", "read_erp", "read_bank", "wait"] * 7) + ["refund"]
ALL_SIX = ("pub-000a-pending_settle", 0)  # under ROUNDS every family fires (checked below)
FAULT_LABEL = re.compile(r"^(t=\d+ )?(%s)\b" % "|".join(caseviews.FAULT_WORDS.values()))


def _play(task_id, seed, tools, **kwargs):
    episode = Episode(PUBLIC.task(task_id), seed=seed, **kwargs)
    for tool in tools:
        episode.call(tool, **({"ticks": 45} if tool == "wait" else {}))
        if episode.done:
            break
    return episode


def _fault_texts(episode):
    """The frame's texts that name a fault (the shared legend's are not the frame's)."""
    shared = set(timeline.texts(None))
    return [text for text in timeline.texts(episode)
            if text not in shared and FAULT_LABEL.match(text)]


def _counted(marks):
    """Marks by family as `fault_firings` counts them: a reorder swaps two deliveries."""
    counts = Counter(mark.family for mark in marks)
    return {family: n // 2 if family == "reorder" else n for family, n in counts.items()}


def test_an_ended_case_marks_and_names_every_fault_its_record_counts():
    episode = _play(*ALL_SIX, ROUNDS)
    fired = episode.record().fault_firings
    assert episode.done and all(fired.values()), fired  # all six families fired
    marks = caseviews.fault_marks(episode)
    assert _counted(marks) == fired
    assert {mark.tool for mark in marks} == {"read_processor", "read_ledger", "read_erp",
                                             "read_bank"}
    said = _fault_texts(episode)
    for family in fired:  # each family is named on the picture, at least once
        assert any(FAULT_LABEL.match(text)[2] == caseviews.FAULT_WORDS[family] for text in said), \
            family
    delayed = next(mark for mark in marks if mark.family == "delay")
    assert delayed.moved_to > delayed.t and delayed.what  # where it should and did show, what
    assert f"t={delayed.t} delayed to t={delayed.moved_to}: {delayed.what}" in said
    # the same calls with no profile fault: no mark, and no fault named
    clean = _play(*ALL_SIX, ROUNDS, faults=FaultProfile.none())
    assert caseviews.fault_marks(clean) == () and _fault_texts(clean) == []


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_marks_are_exactly_the_firings_on_varied_episodes(seed):
    rng = np.random.default_rng(seed)
    tools = ["read_processor", "read_ledger", "read_erp", "read_bank", "wait",
             "probe_processor", "retry_capture"]
    for index in rng.choice(len(PUBLIC.tasks), 8):
        task = PUBLIC.tasks[index]
        episode = Episode(task, seed=int(rng.integers(1 << 20)))
        while not episode.done:
            tool = tools[rng.integers(len(tools))] if rng.random() > 0.03 else "close"
            args = ({"ticks": int(rng.choice([5, 30, 90]))} if tool == "wait" else
                    {"key": str(rng.choice(["original", "fresh"]))} if tool == "retry_capture"
                    else {})
            episode.call(tool, **args)
        fired = {f: n for f, n in episode.record().fault_firings.items() if n}
        assert _counted(caseviews.fault_marks(episode)) == fired, task.task_id


def test_a_running_case_shows_no_fault_and_its_frame_hides_the_fault_draws():
    """Mid-episode, as the env renders: no fault text, and the frame is the same byte for byte
    whatever the hidden fault draws (another episode seed, no profile at all); once ended, the
    same change shows."""
    env = gym.make("Finality-v0", render_mode="rgb_array")
    env.reset(options={"task_id": ALL_SIX[0], "fault_seed": ALL_SIX[1]})
    episode = env.unwrapped.episode
    actions = [0, 1, 2, 3, 8] * 6 + [12]  # the four reads, a wait; then refund
    for action in actions:
        if not episode.done:
            hidden = copy.copy(episode)
            hidden.seed, hidden.faults = episode.seed + 1, FaultProfile.none()
            frame = env.render()
            assert _fault_texts(episode) == []
            assert frame.tobytes() == timeline.draw(hidden).tobytes()
            with pytest.raises(ValueError, match="ground truth"):
                caseviews.fault_marks(episode)
        env.step(action)
    assert episode.done and any(episode.record().fault_firings.values())
    assert _fault_texts(episode)
    hidden = copy.copy(episode)
    hidden.faults = FaultProfile.none()
    assert not np.array_equal(env.render(), timeline.draw(hidden))
