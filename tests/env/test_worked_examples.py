"""the worked examples and the rules of docs/world.md sections 2, 5 and 8 on hand-built cases."""

import dataclasses

import pytest

import finality_gym
from finality_gym import Episode, FaultProfile
from finality_gym.oracle import oracle_plan, reference_position
from finality_gym.tasks import HORIZON, SHIP_BY

NO_FAULTS = FaultProfile.none()
PUBLIC = finality_gym.load_corpus("public")


def _task(archetype, **changes):
    task = next(t for t in PUBLIC.tasks if t.archetype == archetype and t.twin_id is None)
    return dataclasses.replace(task, **changes)


def test_lost_settlement_walkthrough():
    """The processor says submitted at t=121; the bank shows the settlement only from the batch
    after t_det; the probe says unknown before t_det and settled from it."""
    task = _task("lost_settlement", t_det=250)
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    assert ep.call("read_erp")["status"] == "payment_pending"
    proc = ep.call("read_processor")
    assert proc["t"] == 121
    assert proc["operations"] == [{"op": "cap1", "status": "submitted", "decline": None}]
    assert ep.call("probe_processor")["captures"] == {"cap1": "unknown"}
    ep.call("wait", ticks=249 - ep.now)
    assert ep.now == 249
    assert ep.call("probe_processor")["captures"] == {"cap1": "unknown"}
    assert ep.now == 254
    assert ep.call("probe_processor")["captures"] == {"cap1": "settled"}
    assert ep.call("read_bank")["lines"] == []  # the batch after t_det posts at 300
    assert ep.call("read_processor")["operations"][0]["status"] == "submitted"  # lost there
    ep.call("wait", ticks=300 - ep.now)
    assert ep.call("read_bank")["lines"] == [{"posted": 300, "amount": task.order_value,
                                              "kind": "settlement"}]
    assert ep.call("read_processor")["operations"][0]["status"] == "submitted"
    assert ep.call("read_erp")["status"] == "payment_pending"  # lost there too
    assert ep.call("read_ledger")["balances"]["cash"] == task.order_value
    ep.call("ship")
    rec = ep.record()
    assert rec.gap == 0 and rec.position == task.order_value - round(task.order_value * 0.6)


def test_fresh_retry_on_a_capture_that_settles_collects_twice_and_pays_the_dispute_fee():
    task = _task("pending_settle")
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("retry_capture", key="fresh")
    ep.call("ship")
    rec = ep.record()
    ov = task.order_value
    assert rec.cash == 2 * ov
    assert rec.liability == ov and rec.dispute == 2500
    assert rec.position == 2 * ov - (ov * 6000 + 5000) // 10000 - ov - 2500
    assert rec.gap == rec.reference - rec.position == 2500  # the extra cash is all liability
    assert rec.premature


@pytest.mark.parametrize("archetype", ["pending_settle", "pending_fail", "hard_decline"])
def test_a_keyed_retry_never_collects_twice(archetype):
    task = _task(archetype)
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    for _ in range(8):  # before, around and long after t_det
        ep.call("retry_capture", key="original")
        ep.call("wait", ticks=120)
    ep.call("close")
    rec = ep.record()
    assert rec.cash <= task.order_value
    expected = 0 if task.fate == "fail_hard" else task.order_value
    assert rec.cash == expected


def test_a_keyed_retry_after_a_soft_decline_recovers_the_sale():
    task = _task("pending_fail")
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("wait", ticks=task.t_det - ep.now)
    assert ep.call("probe_processor")["captures"] == {"cap1": "failed_soft"}
    ep.call("retry_capture", key="original")
    assert ep.call("probe_processor")["captures"] == {"cap1": "unknown"}
    ep.call("wait", ticks=task.retry_latency)
    assert ep.call("probe_processor")["captures"] == {"cap1": "settled"}
    ep.call("ship")
    assert ep.record().gap == 0


@pytest.mark.parametrize("split", ["public", "regenerated"])
def test_the_oracle_gap_is_zero_on_every_task(split):
    for task in finality_gym.load_corpus(split).tasks:
        for seed in (0, 3):
            ep = Episode(task, seed=seed)
            for tool, args in oracle_plan(task.fate):
                ep.call(tool, **args)
            rec = ep.record()
            assert rec.gap == 0, task.task_id
            assert rec.reference == reference_position(task)


def test_the_reference_values_by_fate():
    ov = 9900
    settle = _task("pending_settle", order_value=ov)
    soft = _task("pending_fail", order_value=ov)
    hard = _task("hard_decline", order_value=ov)
    assert reference_position(settle) == ov - 5940
    assert reference_position(soft) == ov - 5940
    assert reference_position(hard) == 0


def test_a_refusing_policy_beats_the_oracle_on_late_chargeback():
    task = _task("late_chargeback")
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("wait", ticks=task.t_det - ep.now + 5)
    ep.call("refund")
    rec = ep.record()
    assert rec.position == 0
    assert rec.reference == -((task.order_value * 6000 + 5000) // 10000)
    assert rec.gap < 0


def test_the_chargeback_claws_back_a_shipped_order():
    task = _task("late_chargeback")
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("ship")
    kinds = [e.kind for e in ep.world.log]
    assert "chargeback" in kinds and ep.record().cash == 0


def test_close_leaves_a_pending_capture_to_settle_into_a_liability():
    task = _task("unresolvable", fate="settle")
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("close")
    rec = ep.record()
    assert rec.cash == task.order_value and rec.liability == task.order_value
    assert rec.dispute == 2500 and rec.position == -2500


def test_refund_voids_what_is_pending_and_returns_what_settled():
    task = _task("pending_settle")
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("wait", ticks=task.t_det - ep.now)
    ep.call("retry_capture", key="fresh")  # pending when we refund
    ep.call("refund")
    kinds = [e.kind for e in ep.world.log]
    assert kinds.count("refunded") == 1 and kinds.count("capture_voided") == 1
    assert ep.record().cash == 0 and ep.record().position == 0


@pytest.mark.parametrize("wait,expect_ship", [(0, True), (SHIP_BY - 240 - 120 + 1, False)])
def test_the_escalation_specialist(wait, expect_ship):
    task = _task("duplicate_settlement", t_det=100)
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    if wait:
        ep.call("wait", ticks=wait)
    ep.call("escalate")
    rec = ep.record()
    assert rec.escalated and rec.escalation == 1800
    assert rec.goods_left is expect_ship
    assert rec.cash == (task.order_value if expect_ship else 0)


def test_the_specialist_refunds_over_collection_when_it_ships():
    task = _task("duplicate_settlement", t_det=100)
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("retry_capture", key="fresh")
    ep.call("escalate")
    rec = ep.record()
    assert rec.goods_left and rec.cash == task.order_value and rec.liability == 0


def test_ship_after_the_deadline_is_refused_and_the_episode_goes_on():
    task = _task("pending_settle")
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("wait", ticks=SHIP_BY - ep.now)
    assert ep.call("ship") == {"ok": True, "tool": "ship", "t": SHIP_BY}
    ep = Episode(task, seed=0, faults=NO_FAULTS)
    ep.call("wait", ticks=SHIP_BY - ep.now + 1)
    result = ep.call("ship")
    assert "error" in result and "deadline" in result["error"]
    assert not ep.done and ep.calls_used == 2 and ep.now == SHIP_BY + 2


def test_budget_lapse_is_a_close():
    ep = Episode(_task("pending_settle"), seed=0)
    for _ in range(40):
        ep.call("read_erp")
    assert ep.done and ep.lapsed and ep.disposition == "close"
    rec = ep.record()
    assert rec.lapsed and rec.calls_used == 40 and rec.end_t == 160 and rec.premature


def test_horizon_lapse_and_wait_clamping():
    ep = Episode(_task("pending_settle"), seed=0)
    result = ep.call("wait", ticks=10_000)
    assert result["ticks"] == HORIZON - 120
    assert ep.done and ep.lapsed and ep.now == HORIZON and not ep.record().premature


def test_retry_acknowledgement_reveals_nothing():
    task = _task("hard_decline")
    acks = set()
    for when in (0, task.t_det - 120 + 1):
        for key in ("original", "fresh"):
            ep = Episode(task, seed=0)
            if when:
                ep.call("wait", ticks=when)
            result = ep.call("retry_capture", key=key)
            acks.add((result["ack"], tuple(sorted(result))))
    assert len(acks) == 1
