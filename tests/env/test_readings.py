"""One reading of tool results (`finality_gym.readings`): every status a read or a probe can show
has a state, and the three readers (the encoder's observation, the timeline's colours, the
scripted policies' verdicts) say the same of every result the engine returns."""

import numpy as np
import pytest

import finality_gym
from agents.scripted import verdicts
from finality_gym import readings
from finality_gym.encoder import ERP_STATUSES, PROBE_STATUSES, PROC_STATUSES, ObservationEncoder
from finality_gym.episode import READS
from finality_gym.frame import NOTHING, STATE_COLOUR
from finality_gym.replicas import Replicas
from finality_gym.tracks import erp_view, ledger_view, probe_view, processor_view
from finality_gym.world import DISPOSITIONS

PUBLIC = finality_gym.load_corpus("public")
VERDICT_OF = {"absent": verdicts.PENDING, "submitted": verdicts.PENDING,
              "reversed": verdicts.PENDING}  # the rest of PROC_STATUSES are verdicts themselves
ERP_VERDICT = {"paid": verdicts.SETTLED, "payment_failed": verdicts.FAILED_SOFT}  # else pending


def _results(n_tasks=60):
    """Every read and probe result of random episodes, and reads after each one's end (where
    refunds, voids and chargebacks show), with the episode's order value."""
    rng = np.random.default_rng(0)
    tools = READS + ("probe_processor", "wait", "retry_capture")
    for index in rng.choice(len(PUBLIC.tasks), n_tasks):
        task = PUBLIC.tasks[index]
        episode = finality_gym.Episode(task, seed=int(rng.integers(1 << 20)),
                                       faults=finality_gym.FaultProfile(0.5))
        while not episode.done:
            tool = str(rng.choice(tools if rng.random() > 0.05 else DISPOSITIONS))
            args = ({"ticks": 30} if tool == "wait" else
                    {"key": str(rng.choice(["original", "fresh"]))} if tool == "retry_capture"
                    else {})
            result = episode.call(tool, **args)
            if tool in READS or tool == "probe_processor":
                yield task.order_value, result
        replicas = Replicas(episode.world, task, episode.seed, episode.faults)
        for k, t in enumerate(range(episode.now, 1801, 150)):
            episode.world.advance(t)
            for system, tool in enumerate(READS):
                yield task.order_value, {**replicas.read(system, t, 100 + k), "tool": tool, "t": t}


def test_the_encoder_the_timeline_and_the_verdicts_agree_on_every_result():
    seen = set()
    for order_value, result in _results():
        tool = result["tool"]
        encoder = ObservationEncoder()
        encoder.reset(order_value)
        obs = encoder.update(READS.index(tool) if tool in READS else 4, result, result["t"], 1)
        if tool == "read_processor":
            original = PROC_STATUSES[int(np.argmax(obs[6:12]))]
            newest = PROC_STATUSES[int(np.argmax(obs[12:18]))]
            assert verdicts.processor(result) == VERDICT_OF.get(newest, newest)
            assert processor_view(result)[1] == STATE_COLOUR.get(original, NOTHING)
            seen.update((original, newest))
        elif tool == "read_erp":
            status = ERP_STATUSES[int(np.argmax(obs[28:37]))]
            assert status == result["status"]
            assert erp_view(result)[1] == STATE_COLOUR[readings.ERP_STATE[status]]
            assert verdicts.erp(result) == ERP_VERDICT.get(status, verdicts.PENDING)
        elif tool == "read_ledger":
            state = readings.ledger_state(result)
            assert ledger_view(result)[1] == STATE_COLOUR[state]
            assert (verdicts.ledger(result) == verdicts.SETTLED) == (obs[21] > 0)
            assert (state == readings.FAILED_SOFT) == (obs[21] <= 0 and obs[25] > 0)
        elif tool == "read_bank":
            assert (verdicts.bank(result) == verdicts.SETTLED) == (obs[39] > 0)
        elif not readings.refused(result):
            answer = PROBE_STATUSES[int(np.argmax(obs[42:48]))]
            assert answer == (readings.original_answer(result) or "none")
            assert probe_view(result)[1] == STATE_COLOUR.get(answer, NOTHING)
    assert seen == set(PROC_STATUSES)  # every processor state was read, so each was checked


def test_a_result_reads_as_its_state():
    def op(name, status, decline=None):
        return {"op": name, "status": status, "decline": decline}

    processor = {"operations": [op("cap1", "failed", "hard"), op("cap2", "charged_back")]}
    assert readings.capture_state(readings.original_capture(processor)) == readings.FAILED_HARD
    assert readings.capture_state(readings.newest_capture(processor)) == readings.REVERSED
    assert verdicts.processor(processor) == verdicts.PENDING  # the newest decides
    ledger = {"entries": [{"memo": "capture_failed"}, {"memo": "capture_settled"}],
              "balances": {"cash": 100}}
    assert readings.ledger_state(ledger) == readings.SETTLED  # cash outweighs a failure
    ledger = {"entries": [{"memo": "refunded"}], "balances": {"cash": 0}}
    assert readings.ledger_state(ledger) == readings.REVERSED
    assert verdicts.ledger(ledger) == verdicts.PENDING
    bank = {"lines": [{"amount": 100}, {"amount": -100}]}
    assert readings.bank_totals(bank) == (100, 100, 1, 1)
    assert readings.bank_state(bank) == readings.REVERSED  # the picture: nothing kept
    assert verdicts.bank(bank) == verdicts.SETTLED  # the policies: any credit line
    probe = {"captures": {"cap1": "failed_soft", "cap3": "settled", "cap2": "unknown"}}
    assert (readings.original_answer(probe), readings.newest_answer(probe)) == (
        "failed_soft", "settled")
    assert readings.refused({"error": "probe refused"}) and not readings.refused(probe)


@pytest.mark.parametrize("status", ERP_STATUSES)
def test_every_erp_status_the_encoder_knows_has_a_state_and_a_colour(status):
    assert set(readings.ERP_STATE) == set(ERP_STATUSES)
    assert readings.ERP_STATE[status] in STATE_COLOUR
