"""The shipped PPO models are the ones the README's tables were graded from, and they load."""

import hashlib
from pathlib import Path

import pytest

from agents import run_episode
from agents.learned.policy import load_sb3
from finality_gym import load_corpus

MODELS = Path(__file__).resolve().parents[2] / "models"
SUMS = dict(reversed(line.split()) for line in (MODELS / "SHA256SUMS").read_text().splitlines())


def test_every_shipped_model_is_listed_with_its_hash():
    assert set(SUMS) == {p.name for p in MODELS.glob("*.zip")} and SUMS
    for name, digest in SUMS.items():
        assert hashlib.sha256((MODELS / name).read_bytes()).hexdigest() == digest, name


@pytest.mark.parametrize("name", sorted(SUMS))
def test_a_shipped_model_loads_and_plays_reproducibly(name):
    policy = load_sb3(MODELS / name)
    tasks = load_corpus("regenerated").tasks[::40]
    first = [run_episode(policy, task, 1, probe="none" if "noprobe" in name else "full")
             for task in tasks]
    again = [run_episode(load_sb3(MODELS / name), task, 1,
                         probe="none" if "noprobe" in name else "full") for task in tasks]
    assert first == again
    assert all(not r.lapsed for r in first)
