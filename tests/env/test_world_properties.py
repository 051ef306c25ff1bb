"""Property-based tests of the world's invariants (docs/world.md sections 2 to 7)."""

import json
import subprocess
import sys

from hypothesis import assume, event as note_event, given, settings
from hypothesis import strategies as st
from tests.env.strategies import (ALL_TASKS, calls, open_calls, play, profiles, seeds, tasks,
                                  twin_pairs)

import finality_gym
from finality_gym.economics import outcome_of, price
from finality_gym.faults import FaultProfile, draw, episode_key
from finality_gym.replicas import LATENCY, Replicas
from finality_gym.tasks import HORIZON


def _all_deliveries(episode):
    """Every system's deliveries of every event up to the horizon, built from scratch (the
    episode is closed first if it is still open, so that its log runs to the horizon)."""
    if not episode.done:
        episode.call("close")
    replicas = Replicas(episode.world, episode.task, episode.seed, episode.faults)
    for system in range(4):
        replicas.sync(system, HORIZON)
    return replicas


@given(tasks, seeds, profiles, calls)
def test_no_delivery_arrives_before_its_event(task, seed, profile, sequence):
    episode = finality_gym.Episode(task, seed=seed, faults=profile)
    play(episode, sequence)
    for system, deliveries in enumerate(_all_deliveries(episode).deliveries):
        for arrival, _, copy, event, _ in deliveries:
            assert arrival >= event.t, (system, copy, event)


@given(tasks, seeds, st.sampled_from([0.3, 0.6, 1.0]), calls)
def test_reorder_only_exchanges_arrivals_at_most_60_apart(task, seed, p, sequence):
    """With and without the reorder family (all else equal), the arrivals that differ come in
    adjacent pairs that exchanged their arrival times, at most 60 ticks apart."""
    families = frozenset({"delay", "duplicate", "reorder"})
    runs = []
    for profile in (FaultProfile(p, families), FaultProfile(p, families - {"reorder"})):
        episode = finality_gym.Episode(task, seed=seed, faults=profile)
        play(episode, sequence)
        runs.append(_all_deliveries(episode).deliveries)
    for with_reorder, without in zip(*runs):
        primaries = [(a[0], b[0]) for a, b in zip(with_reorder, without) if a[2] == 0]
        assert len(with_reorder) == len(without)
        changed = [i for i, (x, y) in enumerate(primaries) if x != y]
        while changed:
            i, j = changed[0], changed[1]
            assert j == i + 1
            assert primaries[i][0] == primaries[j][1] and primaries[j][0] == primaries[i][1]
            assert abs(primaries[i][1] - primaries[j][1]) <= 60
            changed = changed[2:]


CLEAN_ARCHETYPES = ("pending_settle", "pending_fail", "unresolvable", "late_chargeback")


@given(st.sampled_from([t for t in ALL_TASKS if t.archetype in CLEAN_ARCHETYPES]), seeds,
       open_calls, st.integers(min_value=0, max_value=HORIZON))
def test_without_faults_the_four_systems_agree_once_settled_in(task, seed, sequence, extra):
    """With every fault off, once the latencies and the batch have passed since the last event,
    the processor, the ledger, the ERP and the bank tell the same story."""
    episode = finality_gym.Episode(task, seed=seed, faults=FaultProfile.none())
    play(episode, sequence)
    world = episode.world
    last = max([e.t for e in world.log] + [a.determined_at for a in world.attempts]
               + [task.chargeback_at or 0])
    quiet = last + max(LATENCY) + 60
    t = max(quiet, episode.now)
    assume(t < HORIZON - 10 and not episode.done and episode.calls_used <= 35)
    episode.call("wait", ticks=max(1, min(t - episode.now + extra, HORIZON - 5 - episode.now)))
    assume(not episode.done and episode.now >= quiet)
    note_event("compared")
    proc = episode.call("read_processor")["operations"]
    ledger = episode.call("read_ledger")
    erp = episode.call("read_erp")["status"]
    bank = episode.call("read_bank")["lines"]
    settled_ops = sum(1 for op in proc if op["status"] in ("settled", "charged_back"))
    ov = task.order_value
    bank_credits = sum(line["amount"] for line in bank if line["amount"] > 0)
    bank_total = sum(line["amount"] for line in bank)
    assert bank_credits == settled_ops * ov
    assert ledger["balances"]["cash"] == bank_total
    assert ledger["imbalance"] == 0
    newest = proc[-1]["status"]
    expected_erp = {"settled": "paid", "failed": "payment_failed", "submitted": "payment_pending",
                    "charged_back": "disputed"}[newest]
    assert erp == expected_erp


@given(tasks, seeds, profiles, calls)
def test_fault_draws_do_not_depend_on_generation_order(task, seed, profile, sequence):
    """Building the systems' deliveries in another order, or in many small steps instead of
    one, gives the same deliveries and the same firings; each delivery's draw is the pure
    function of its identity."""
    episode = finality_gym.Episode(task, seed=seed, faults=profile)
    play(episode, sequence)
    at_once = _all_deliveries(episode)
    stepwise = Replicas(episode.world, task, seed, profile)
    for t in range(0, HORIZON + 1, 97):
        for system in (3, 1, 2, 0):
            stepwise.sync(system, t)
    for system in (2, 0, 3, 1):
        stepwise.sync(system, HORIZON)
    assert stepwise.deliveries == at_once.deliveries
    assert stepwise.firings == at_once.firings
    key = episode_key(task.fault_key, seed)
    assert key == episode_key(task.fault_key, seed)
    assert draw(key, 12345) == draw(key, 12345) != draw(key, 12346)


_SCRIPT = """
import json, sys
import finality_gym
from finality_gym.faults import FaultProfile
out = []
corpus = finality_gym.load_corpus("public")
for task_id, seed, intensity, families, sequence in json.loads(sys.stdin.read()):
    ep = finality_gym.Episode(corpus.task(task_id), seed=seed,
                              faults=FaultProfile(intensity, frozenset(families)))
    results = []
    for tool, args in sequence:
        if ep.done:
            break
        results.append(ep.call(tool, **args))
    out.append({"results": results, "record": ep.record().to_dict() if ep.done else None})
print(json.dumps(out))
"""

_case = st.tuples(st.sampled_from(finality_gym.load_corpus("public").tasks), seeds, profiles, calls)


@settings(max_examples=4)
@given(st.lists(_case, min_size=25, max_size=25))
def test_same_inputs_give_identical_results_in_two_processes(cases):
    """One subprocess plays a batch of cases; two of them, and this process, must agree."""
    payload = json.dumps([[t.task_id, seed, p.intensity, sorted(p.families), seq]
                          for t, seed, p, seq in cases])
    outs = [subprocess.run([sys.executable, "-c", _SCRIPT], input=payload, capture_output=True,
                           text=True, check=True).stdout for _ in range(2)]
    assert outs[0] == outs[1]
    here = []
    for task, seed, profile, sequence in cases:
        episode = finality_gym.Episode(task, seed=seed, faults=profile)
        results = play(episode, sequence)
        here.append({"results": results,
                     "record": episode.record().to_dict() if episode.done else None})
    assert json.loads(outs[0]) == json.loads(json.dumps(here))


@given(twin_pairs, seeds, profiles, calls)
def test_twin_halves_return_identical_results_before_t_det(pair, seed, profile, sequence):
    settle, fail = pair
    assert settle.t_det == fail.t_det and settle.fault_key == fail.fault_key
    a = finality_gym.Episode(settle, seed=seed, faults=profile)
    b = finality_gym.Episode(fail, seed=seed, faults=profile)
    compared = 0
    for tool, args in sequence:
        if a.done or b.done or a.now >= settle.t_det:
            break
        assert a.now == b.now
        assert a.call(tool, **args) == b.call(tool, **args)
        compared += 1
    assert compared == 0 or a.calls_used == b.calls_used


@given(tasks, seeds, st.lists(profiles, min_size=2, max_size=4), calls)
def test_probe_results_are_identical_under_every_fault_profile(task, seed, profiles_, sequence):
    probes = []
    for profile in profiles_ + [FaultProfile.none()]:
        episode = finality_gym.Episode(task, seed=seed, faults=profile)
        results = play(episode, sequence)
        probes.append([r for r in results if r["tool"] == "probe_processor"])
    assert all(p == probes[0] for p in probes)


@given(tasks, seeds, profiles, calls)
def test_position_is_cash_minus_the_four_deductions(task, seed, profile, sequence):
    episode = finality_gym.Episode(task, seed=seed, faults=profile)
    play(episode, sequence)
    if not episode.done:
        episode.call("close")
    rec = episode.record()
    assert rec.position == rec.cash - rec.cogs - rec.liability - rec.dispute - rec.escalation
    assert rec.gap == rec.reference - rec.position
    again = price(outcome_of(episode.world.log, task.order_value)).total
    assert again == rec.position
    assert all(v >= 0 for v in (rec.cogs, rec.liability, rec.dispute, rec.escalation))
    if task.archetype != "late_chargeback":
        assert rec.gap >= 0
