"""The guard (finality_gym/guard.py): what it refuses, what a refusal costs and changes, that the
gate never meets it, and that a guarded episode replays only as one."""

import pytest

from agents import make_policy
from finality_gym import PROBE_ARMS, Episode, load_corpus
from finality_gym.episode import compact_calls, replay
from finality_gym.guard import MARGIN_TICKS
from finality_gym.policy import run_episode
from finality_gym.tasks import SHIP_BY

CORPUS = load_corpus("public")


def task(fate: str, archetype: str):
    return next(t for t in CORPUS.tasks if t.fate == fate and t.archetype == archetype)


SETTLES = task("settle", "pending_settle")
SOFT = task("fail_soft", "pending_fail")
QUICK = min((t for t in CORPUS.tasks if t.fate == "fail_soft"),
            key=lambda t: t.t_det + t.retry_latency)  # a delayed probe still sees it in time
HARD = task("fail_hard", "hard_decline")


def guarded(t):
    return Episode(t, seed=0, guard=True)


def refused(result: dict) -> bool:
    return result.get("error", "").startswith("refused by the guard")


@pytest.mark.parametrize("probe", PROBE_ARMS)
def test_the_gate_never_meets_a_refusal(probe):
    """The guard's margins are the gate's: behind it, the gate plays every case as it does
    without it (and its refusals never show in any result)."""
    gate = make_policy("finality_gate")
    for t in CORPUS.tasks:
        for seed in (0, 1):
            assert (run_episode(gate, t, seed, probe=probe, guard=True)
                    == run_episode(gate, t, seed, probe=probe))


@pytest.mark.parametrize("tool,args", [("ship", {}), ("refund", {}), ("write_off", {}),
                                       ("close", {}), ("retry_capture", {"key": "fresh"})])
def test_an_irreversible_call_without_evidence_is_refused_costs_its_call_and_changes_nothing(
        tool, args):
    episode = guarded(SETTLES)
    events = len(episode.world.log)
    result = episode.call(tool, **args)
    assert refused(result) and result["tool"] == tool and result["t"] == 120
    assert episode.calls_used == 1 and episode.now == 121 and not episode.done
    assert len(episode.world.log) == events and not episode.premature
    unguarded = Episode(SETTLES, seed=0)
    assert "error" not in unguarded.call(tool, **args)  # the same call without the guard acts


def test_reads_waits_probes_original_retries_and_escalation_always_pass():
    episode = guarded(SETTLES)
    for tool, args in [("read_processor", {}), ("read_bank", {}), ("wait", {"ticks": 3}),
                       ("probe_processor", {}), ("retry_capture", {"key": "original"})]:
        assert not refused(episode.call(tool, **args))
    assert episode.call("escalate") == {"ok": True, "tool": "escalate", "t": 131}


def test_ship_needs_a_probe_answer_showing_a_settled_capture():
    episode = guarded(SETTLES)
    assert episode.call("probe_processor")["captures"] == {"cap1": "unknown"}
    assert refused(episode.call("ship"))  # pending is no evidence
    episode.call("wait", ticks=SETTLES.t_det - episode.now)
    episode.call("read_processor")
    assert refused(episode.call("ship"))  # a replica is no evidence
    assert episode.call("probe_processor")["captures"] == {"cap1": "settled"}
    assert refused(episode.call("refund"))  # nor is settled evidence for a refund
    assert episode.call("ship")["ok"] and episode.disposition == "ship"
    assert episode.record().gap == 0


def test_a_retry_makes_the_evidence_stale():
    episode = guarded(SOFT)
    episode.call("wait", ticks=SOFT.t_det - episode.now)
    assert episode.call("probe_processor")["captures"] == {"cap1": "failed_soft"}
    episode.call("retry_capture", key="original")
    assert refused(episode.call("close"))  # the answer predates the retry
    episode.call("wait", ticks=SOFT.retry_latency)
    assert episode.call("probe_processor")["captures"] == {"cap1": "settled"}
    assert episode.call("ship")["ok"]


@pytest.mark.parametrize("probe", ["full", "delayed"])
def test_no_order_of_retries_charges_the_card_twice(probe):
    """A fresh capture beside a live original attempt is the double charge the guard exists to
    stop: after a fresh capture the original key needs the fresh one shown failed, and a
    delayed answer that predates the last retry is no evidence for a fresh one."""
    lag = 120 if probe == "delayed" else 0
    episode = Episode(QUICK, seed=0, probe=probe, guard=True)
    episode.call("wait", ticks=QUICK.t_det + lag - episode.now)
    if probe == "full":
        assert episode.call("probe_processor")["captures"] == {"cap1": "failed_soft"}
        assert not refused(episode.call("retry_capture", key="fresh"))
        assert refused(episode.call("retry_capture", key="original"))
    else:
        assert not refused(episode.call("retry_capture", key="original"))
        assert episode.call("probe_processor")["captures"] == {"cap1": "failed_soft"}  # stale
        assert refused(episode.call("retry_capture", key="fresh"))
    episode.call("wait", ticks=QUICK.retry_latency + lag + 2)
    assert "settled" in episode.call("probe_processor")["captures"].values()
    assert episode.call("ship")["ok"]
    assert episode.record().gap == 0 and episode.record().cash == QUICK.order_value


def test_a_refused_retry_leaves_the_evidence_current():
    episode = guarded(SETTLES)
    episode.call("wait", ticks=SETTLES.t_det - episode.now)
    assert episode.call("probe_processor")["captures"] == {"cap1": "settled"}
    assert refused(episode.call("retry_capture", key="fresh"))
    assert episode.call("ship")["ok"]


def test_every_capture_failed_permits_close_write_off_refund_and_a_fresh_retry():
    for tool, args in [("close", {}), ("write_off", {}), ("refund", {}),
                       ("retry_capture", {"key": "fresh"})]:
        episode = guarded(HARD)
        episode.call("wait", ticks=HARD.t_det - episode.now)
        assert episode.call("probe_processor")["captures"] == {"cap1": "failed_hard"}
        assert not refused(episode.call(tool, **args))


def test_a_refund_passes_once_a_verified_ship_no_longer_fits():
    late = guarded(SETTLES)
    late.call("wait", ticks=SHIP_BY - MARGIN_TICKS - 1 - late.now)
    assert refused(late.call("refund"))  # t = 589: a probe and a ship still fit
    assert late.call("refund")["ok"]     # t = 590
    short = guarded(SETTLES)
    while short.calls_used < 37:  # 40 calls: 3 left is still enough to verify and ship
        short.call("read_erp")
    assert refused(short.call("refund"))
    assert short.call("refund")["ok"]  # 2 left


def test_an_order_shown_settled_is_not_refunded_while_it_can_still_ship():
    episode = guarded(SETTLES)
    episode.call("wait", ticks=SHIP_BY - MARGIN_TICKS - 5 - episode.now)
    assert episode.call("probe_processor")["captures"] == {"cap1": "settled"}  # now t = 590
    assert refused(episode.call("refund"))
    episode.call("wait", ticks=SHIP_BY - episode.now)  # t = 600: the last tick to ship
    assert refused(episode.call("refund"))
    assert "ship refused" in episode.call("ship")["error"]  # t = 601: past the deadline
    assert episode.call("refund")["ok"]  # nothing can ship: the money goes back


def test_a_guarded_episode_replays_only_behind_the_guard():
    episode = guarded(SETTLES)
    episode.call("ship")  # refused
    episode.call("wait", ticks=SETTLES.t_det - episode.now)
    episode.call("probe_processor")
    episode.call("ship")
    calls = compact_calls(episode.history)
    again = replay(SETTLES, 0, calls, lapsed=False, guard=True)
    assert again.record() == episode.record() and again.history == episode.history
    with pytest.raises(ValueError, match="does not replay"):
        replay(SETTLES, 0, calls, lapsed=False)  # unguarded, the first ship ends the case


def test_the_guard_is_a_bool():
    with pytest.raises(ValueError, match="guard must be True or False"):
        Episode(SETTLES, guard="yes")
