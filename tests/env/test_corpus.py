"""The corpus of docs/world.md section 6: sizes, mix, twins, splits, fingerprints, JSON round trip;
the private split the same (its ids: tests/grading/test_private_split.py)."""

import json
import subprocess
import sys
from collections import Counter

import pytest

import finality_gym
from finality_gym.corpus import (PRIVATE, Corpus, canonical_json, corpus_from_json, fingerprint,
                                 generate)
from finality_gym.tasks import Task

EXPECTED = {"lost_settlement": 36, "stale_processor": 36, "pending_settle": 45,
            "pending_fail": 42, "unresolvable": 48, "duplicate_settlement": 36,
            "partial_ledger": 36, "late_chargeback": 12, "hard_decline": 30}
T_DET = {"lost_settlement": (150, 450), "stale_processor": (130, 400),
         "pending_settle": (150, 540), "pending_fail": (150, 480), "unresolvable": (620, 1500),
         "duplicate_settlement": (20, 300), "partial_ledger": (20, 300),
         "late_chargeback": (130, 400), "hard_decline": (130, 450)}
# The published splits as they are generated today: a change to the generator that moves a byte
# of them (a task, an id, a field) changes these.
FINGERPRINTS = {"public": "eef0c11e96a9ebf3", "regenerated": "3588f2fb1cd5793c"}
# A private split's master seed, as `python -m eval keygen` makes one (128 random bits).
MASTER_SEED = 0x1c3012b0742023be08d4b5398b3e9c088


def corpus_of(split: str) -> Corpus:
    """A published split, or the private split of MASTER_SEED (without making it this process's
    private split)."""
    if split != PRIVATE:
        return finality_gym.load_corpus(split)
    tasks = generate(PRIVATE, MASTER_SEED)
    return Corpus(PRIVATE, fingerprint(PRIVATE, tasks), tasks)


@pytest.mark.parametrize("split", ["public", "regenerated", PRIVATE])
def test_mix(split):
    corpus = corpus_of(split)
    assert corpus.split == split
    assert len(corpus.tasks) == 321
    assert len({t.task_id for t in corpus.tasks}) == 321
    assert Counter(t.archetype for t in corpus.tasks) == EXPECTED
    assert len(corpus.units) == 276
    pairs = [u for u in corpus.units if len(u) == 2]
    assert len(pairs) == 45
    kinds = Counter((a.archetype, b.archetype) for a, b in pairs)
    assert kinds == {("pending_settle", "pending_fail"): 30, ("unresolvable", "unresolvable"): 15}
    for a, b in pairs:
        assert (a.twin_half, b.twin_half) == ("settle", "fail")
        assert a.twin_id == b.twin_id
        same = ("order_value", "t_det", "retry_latency", "fault_key")
        assert all(getattr(a, f) == getattr(b, f) for f in same)
        assert a.fate == "settle" and b.fate in ("fail_soft", "fail_hard")
        lo, hi = (150, 480) if a.archetype == "pending_settle" else (620, 1500)
        assert lo <= a.t_det <= hi
    for t in corpus.tasks:
        if t.twin_id is None:
            lo, hi = T_DET[t.archetype]
            assert lo <= t.t_det <= hi, t
        assert 30 <= t.retry_latency <= 90
        assert t.order_value in (2499, 4999, 9900, 18900, 34900, 74900, 129900, 349900)
    fates = Counter(t.fate for t in corpus.tasks
                    if t.archetype == "unresolvable" and t.twin_id is None)
    assert set(fates) <= {"settle", "fail_hard"} and sum(fates.values()) == 18
    keys = [t.fault_key for t in corpus.tasks]
    assert len(set(keys)) == 276  # one per construction


def test_fingerprints_differ_and_are_16_hex_digits():
    a = finality_gym.load_corpus("public").fingerprint
    b = finality_gym.load_corpus("regenerated").fingerprint
    c = corpus_of(PRIVATE).fingerprint
    assert len({a, b, c}) == 3
    for f in (a, b, c):
        assert len(f) == 16 and int(f, 16) >= 0


@pytest.mark.parametrize("split", ["public", "regenerated"])
def test_the_published_splits_are_the_known_ones(split):
    corpus = finality_gym.load_corpus(split)
    assert corpus.fingerprint == FINGERPRINTS[split]
    assert fingerprint(split, generate(split)) == FINGERPRINTS[split]
    prefix = split[:3]
    assert [t.task_id for t in corpus.tasks[:2]] == [f"{prefix}-000a-pending_settle",
                                                    f"{prefix}-000b-pending_fail"]
    assert corpus.tasks[0].twin_id == f"{prefix}-twin-000"
    assert corpus.tasks[-1].task_id == f"{prefix}-275-hard_decline"


def test_fingerprints_are_stable_across_processes():
    code = ("import finality_gym as f; print(f.load_corpus('public').fingerprint, "
            "f.load_corpus('regenerated').fingerprint)")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": str(s), "PATH": ""}).stdout
            for s in (1, 2)}
    assert len(outs) == 1
    here = f"{finality_gym.load_corpus('public').fingerprint} " \
           f"{finality_gym.load_corpus('regenerated').fingerprint}\n"
    assert outs == {here}


def test_task_ids_are_unique_across_splits():
    ids = [t.task_id for s in ("public", "regenerated", PRIVATE) for t in corpus_of(s).tasks]
    assert len(set(ids)) == len(ids) == 963


def test_unknown_split_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown split 'holdout'; valid: public, regenerated"):
        finality_gym.load_corpus("holdout")


def test_json_round_trip():
    corpus = finality_gym.load_corpus("public")
    text = canonical_json(corpus.split, corpus.tasks)
    again = corpus_from_json(text)
    assert again.tasks == corpus.tasks and again.fingerprint == corpus.fingerprint
    for task in corpus.tasks[:20]:
        assert Task.from_dict(json.loads(json.dumps(task.to_dict()))) == task


@pytest.mark.parametrize("text,message", [
    ("{not json", "not a corpus JSON document"),
    ('{"split": "public"}', "not a corpus JSON document"),
    ('{"split": "x", "tasks": [{"task_id": "a"}]}', r"not a task: unknown keys \[\], missing "
                                                    r"keys \[.*'fate'"),
])
def test_corrupt_corpus_json(text, message):
    with pytest.raises(ValueError, match=message):
        corpus_from_json(text)


def test_task_validation():
    task = finality_gym.load_corpus("public").tasks[0]
    with pytest.raises(ValueError,
                       match=r"not a task: unknown keys \['colour'\], missing keys \[\]"):
        Task.from_dict({**task.to_dict(), "colour": "red"})
    with pytest.raises(ValueError,
                       match=r"not a task: unknown keys \[\], missing keys \['fate'\]"):
        Task.from_dict({k: v for k, v in task.to_dict().items() if k != "fate"})
    with pytest.raises(ValueError, match="unknown fate"):
        Task.from_dict({**task.to_dict(), "fate": "maybe"})
    with pytest.raises(ValueError, match="t_det must lie"):
        Task.from_dict({**task.to_dict(), "t_det": 5000})
