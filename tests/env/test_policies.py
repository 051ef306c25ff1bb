"""Each policy on hand-built situations (docs/world.md section 9), the floors, and privilege isolation."""

import statistics

import numpy as np
import pytest

import finality_gym
from agents.registry import HEADLINE
from agents import FLOORS, Brief, Privilege, brief_for, make_policy, run_episode
from agents.learned.policy import load_sb3
from finality_gym.policy import GymPolicy
from finality_gym.env import FinalityEnv

BRIEF = Brief(order_value=10000, handover_at=120, ship_by=600, horizon=1800, budget=40,
              probe="full", seed=7)
PUBLIC = finality_gym.load_corpus("public")


class Feed:
    """Plays a policy against hand-written answers: `answer(call) -> payload` per call."""

    def __init__(self, policy, brief=BRIEF):
        self.policy = policy
        policy.reset(brief)
        self.now = brief.handover_at
        self.calls = []
        self.next = policy.act(None)

    def run(self, answer, max_calls=40):
        while len(self.calls) < max_calls:
            tool, args = self.next
            self.calls.append((self.now, tool, args))
            if tool in ("ship", "refund", "write_off", "escalate", "close"):
                return self.calls
            payload = dict(answer(tool, args, self.now) or {})
            result = {**payload, "tool": tool, "t": self.now}
            if tool == "wait":
                result["ticks"] = args["ticks"]
            self.now += args["ticks"] if tool == "wait" else (5 if tool == "probe_processor" else 1)
            self.next = self.policy.act(result)
        return self.calls


def proc(status, decline=None):
    return {"operations": [{"op": "cap1", "status": status, "decline": decline}]}


def ledger(cash=0, clearing=0, failed=False):
    entries = [{"memo": "capture_failed"}] if failed else []
    return {"balances": {"cash": cash, "clearing": clearing, "sales": 0}, "entries": entries,
            "imbalance": 0}


def bank(*amounts):
    return {"lines": [{"posted": 60, "amount": a, "kind": "settlement"} for a in amounts]}


PENDING = {"read_processor": proc("submitted"), "read_ledger": ledger(clearing=10000),
           "read_erp": {"status": "payment_pending"}, "read_bank": bank()}


def tools(calls):
    return [(tool, args) for _, tool, args in calls]


def test_optimistic_ships_on_a_clearing_entry_and_refunds_at_the_deadline():
    calls = Feed(make_policy("optimistic")).run(lambda t, a, now: ledger(clearing=10000))
    assert tools(calls) == [("read_ledger", {}), ("ship", {})]
    calls = Feed(make_policy("optimistic")).run(lambda t, a, now: ledger())
    assert tools(calls)[:3] == [("read_ledger", {}), ("wait", {"ticks": 30}), ("read_ledger", {})]
    assert calls[-1][1] == "refund" and calls[-1][0] <= 600
    assert calls[-2][1] == "read_ledger" and calls[-2][0] + 1 + 30 + 1 > 600


@pytest.mark.parametrize("status,decline,expected", [
    ("settled", None, ["read_processor", "ship"]),
    ("failed", "soft", ["read_processor", "close"]),
    ("failed", "hard", ["read_processor", "close"]),
    ("submitted", None, ["read_processor", "retry_capture", "ship"]),
])
def test_eager(status, decline, expected):
    calls = Feed(make_policy("eager")).run(lambda t, a, now: proc(status, decline))
    assert [c[1] for c in calls] == expected
    if "retry_capture" in expected:
        assert calls[1][2] == {"key": "fresh"}


@pytest.mark.parametrize("answers,expected", [
    ({"read_ledger": ledger(cash=20000)}, "escalate"),
    ({"read_bank": bank(10000, 10000)}, "escalate"),
    ({"read_processor": proc("settled"), "read_ledger": ledger(cash=10000),
      "read_erp": {"status": "paid"}}, "ship"),
    ({"read_processor": proc("failed", "hard"), "read_ledger": ledger(failed=True),
      "read_bank": bank(10000)}, "refund"),
    ({"read_processor": proc("settled"), "read_bank": bank(10000)}, "wait"),  # 2-2 tie: pending
])
def test_majority_vote(answers, expected):
    calls = Feed(make_policy("majority_vote")).run(
        lambda t, a, now: answers.get(t, PENDING.get(t)), max_calls=5)
    assert [c[1] for c in calls[:4]] == ["read_processor", "read_ledger", "read_erp", "read_bank"]
    assert calls[4][1] == expected
    if expected == "wait":
        assert calls[4][2] == {"ticks": 60}


def test_sop_retries_a_soft_decline_once_then_polls_the_bank_then_escalates():
    answers = iter([proc("failed", "soft")] + [proc("failed", "soft")] * 10)
    calls = Feed(make_policy("sop")).run(
        lambda t, a, now: next(answers) if t == "read_processor" else bank())
    assert tools(calls) == [
        ("read_processor", {}), ("retry_capture", {"key": "original"}), ("wait", {"ticks": 60}),
        ("read_processor", {}), ("read_bank", {}), ("wait", {"ticks": 60}),
        ("read_processor", {}), ("read_bank", {}), ("wait", {"ticks": 60}),
        ("read_processor", {}), ("read_bank", {}), ("wait", {"ticks": 60}),
        ("read_processor", {}), ("read_bank", {}), ("escalate", {})]


def test_sop_knobs_hard_decline_and_bank_credit():
    calls = Feed(make_policy("sop:poll_interval=30,max_polls=2")).run(
        lambda t, a, now: proc("submitted") if t == "read_processor" else bank())
    assert [c[1] for c in calls] == ["read_processor", "read_bank", "wait", "read_processor",
                                     "read_bank", "escalate"]
    assert calls[2][2] == {"ticks": 30}
    calls = Feed(make_policy("sop")).run(lambda t, a, now: proc("failed", "hard"))
    assert [c[1] for c in calls] == ["read_processor", "close"]
    calls = Feed(make_policy("sop")).run(
        lambda t, a, now: proc("submitted") if t == "read_processor" else bank(10000))
    assert [c[1] for c in calls] == ["read_processor", "read_bank", "ship"]
    with pytest.raises(ValueError, match="bad knob"):
        make_policy("sop:poll=3")
    with pytest.raises(ValueError, match="takes no knobs"):
        make_policy("react:x=1")


def test_react_rotates_and_decides_from_one_observation():
    answers = {"read_ledger": ledger(failed=True), "read_erp": {"status": "paid"}}
    calls = Feed(make_policy("react")).run(lambda t, a, now: answers.get(t, PENDING.get(t)))
    assert tools(calls) == [("read_processor", {}), ("wait", {"ticks": 30}), ("read_ledger", {}),
                            ("retry_capture", {"key": "original"}), ("read_erp", {}),
                            ("ship", {})]


def test_react_refunds_at_the_deadline():
    calls = Feed(make_policy("react")).run(lambda t, a, now: PENDING[t] if t in PENDING else {})
    assert calls[-1][1] == "refund" and calls[-1][0] <= 600
    assert [c[1] for c in calls[:8:2]] == ["read_processor", "read_ledger", "read_erp",
                                           "read_bank"]


def test_reflection_acts_only_when_the_second_read_agrees():
    erp_answers = iter([{"status": "paid"}, {"status": "payment_pending"}])
    answers = {"read_erp": lambda: next(erp_answers), "read_bank": lambda: bank(10000)}
    calls = Feed(make_policy("reflection")).run(
        lambda t, a, now: answers[t]() if t in answers else PENDING.get(t))
    assert tools(calls) == [
        ("read_processor", {}), ("wait", {"ticks": 30}), ("read_ledger", {}),
        ("wait", {"ticks": 30}), ("read_erp", {}), ("wait", {"ticks": 10}), ("read_erp", {}),
        ("read_bank", {}), ("wait", {"ticks": 10}), ("read_bank", {}), ("ship", {})]


def test_finality_gate_waits_for_a_terminal_answer():
    answers = iter(["unknown", "unknown", "failed_soft", "unknown", "settled"])
    calls = Feed(make_policy("finality_gate")).run(
        lambda t, a, now: {"captures": {"cap1": next(answers)}} if t == "probe_processor" else {})
    assert tools(calls) == [
        ("probe_processor", {}), ("wait", {"ticks": 60}), ("probe_processor", {}),
        ("wait", {"ticks": 60}), ("probe_processor", {}), ("retry_capture", {"key": "original"}),
        ("probe_processor", {}), ("wait", {"ticks": 60}), ("probe_processor", {}), ("ship", {})]
    calls = Feed(make_policy("finality_gate")).run(
        lambda t, a, now: {"captures": {"cap1": "unknown"}})
    assert calls[-1][1] == "refund"
    waits = [c[2]["ticks"] for c in calls if c[1] == "wait"]
    last_probe = [c for c in calls if c[1] == "probe_processor"][-1]
    assert waits[-1] < 60 and last_probe[0] + 5 <= 600 and calls[-2] == last_probe
    calls = Feed(make_policy("finality_gate")).run(
        lambda t, a, now: {"captures": {"cap1": "failed_hard"}})
    assert [c[1] for c in calls] == ["probe_processor", "close"]


def test_random_is_seeded():
    def sequence(seed):
        brief = Brief(**{**BRIEF.__dict__, "seed": seed})
        return tools(Feed(make_policy("random"), brief).run(lambda t, a, now: PENDING.get(t)))
    assert sequence(1) == sequence(1)
    assert any(sequence(1) != sequence(s) for s in range(2, 6))


def test_floors_act_at_once_or_never():
    for name, first in (("always_ship", "ship"), ("always_refund", "refund"),
                        ("always_escalate", "escalate")):
        assert [c[1] for c in Feed(make_policy(name)).run(lambda *a: {})] == [first]
    record = run_episode(make_policy("do_nothing"), PUBLIC.tasks[0], 0)
    assert record.lapsed and record.end_t == 1800


def test_the_floors_score_below_the_finality_gate():
    def mean_gap(name):
        policy = make_policy(name)
        return statistics.mean(run_episode(policy, t, s).gap for t in PUBLIC.tasks for s in (0, 1))
    gate = mean_gap("finality_gate")
    for floor in FLOORS:
        assert mean_gap(floor) > gate, floor


def test_only_the_oracle_is_privileged():
    privileged = [n for n in HEADLINE + FLOORS if type(make_policy(n)).privileged]
    assert privileged == ["finality_oracle"]
    with pytest.raises(PermissionError):
        make_policy("finality_gate").grant(Privilege("settle", 200))
    oracle = make_policy("finality_oracle")
    oracle.reset(BRIEF)
    with pytest.raises(PermissionError, match="needs its Privilege"):
        oracle.act(None)


def test_the_brief_carries_no_truth_and_is_the_same_for_both_twin_halves():
    assert set(Brief.__dataclass_fields__) == {"order_value", "handover_at", "ship_by",
                                               "horizon", "budget", "probe", "seed"}
    for unit in PUBLIC.units:
        if len(unit) == 2:
            assert brief_for(unit[0], 3, "full") == brief_for(unit[1], 3, "full")


def _calls_before_t_det(policy_name, task, seed):
    episode = finality_gym.Episode(task, seed=seed)
    policy = make_policy(policy_name)
    policy.reset(brief_for(task, seed, "full"))
    if type(policy).privileged:
        policy.grant(Privilege(task.fate, task.t_det))
    seen, result = [], None
    while not episode.done and episode.now < task.t_det:
        tool, args = policy.act(result)
        seen.append((episode.now, tool, args))
        result = episode.call(tool, **args)
    return seen


def test_no_unprivileged_policy_acts_differently_on_twin_halves_before_t_det():
    pairs = [u for u in PUBLIC.units if len(u) == 2]
    for name in HEADLINE + FLOORS:
        differs = any(_calls_before_t_det(name, a, s) != _calls_before_t_det(name, b, s)
                      for a, b in pairs for s in (0, 1))
        assert differs == (name == "finality_oracle"), name


def test_gym_policy_sees_exactly_the_env_observations():
    task = PUBLIC.tasks[40]
    actions = [0, 1, 2, 3, 4, 8, 0, 4, 9, 7, 1, 11]
    env = FinalityEnv(info="full")  # `record` in the last step's info
    env_obs = [env.reset(seed=0, options={"task_id": task.task_id, "fault_seed": 2})[0]]
    for action in actions:
        obs, _, terminated, truncated, info = env.step(action)
        env_obs.append(obs)
        if terminated or truncated:
            break
    seen = []
    script = iter(actions)

    def predict(obs, mask):
        seen.append(obs.copy())
        return next(script)

    record = run_episode(GymPolicy("scripted", predict), task, 2)
    assert record == info["record"]
    assert all(np.array_equal(a, b) for a, b in zip(seen, env_obs[:len(seen)]))
    assert len(seen) == len(env_obs) - 1


def test_loading_a_missing_or_corrupt_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model file"):
        load_sb3(tmp_path / "nope.zip")
    bad = tmp_path / "bad.zip"
    bad.write_text("not a zip")
    with pytest.raises(ValueError, match="not a stable-baselines3 model"):
        load_sb3(bad)
    import zipfile
    empty = tmp_path / "empty.zip"
    with zipfile.ZipFile(empty, "w") as archive:
        archive.writestr("readme.txt", "no model here")
    with pytest.raises(ValueError, match="is not a stable-baselines3 model"):
        load_sb3(empty)
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("clairvoyant")
