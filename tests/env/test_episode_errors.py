"""Malformed calls raise a clear error and change nothing; bad constructor arguments too."""

import copy

import pytest

import finality_gym
from finality_gym import Episode, FaultProfile, InvalidCall
from finality_gym.economics import Costs

TASK = finality_gym.load_corpus("public").tasks[0]


def _state(ep):
    return (ep.now, ep.calls_used, ep.done, len(ep.world.log), len(ep.world.attempts),
            copy.deepcopy(ep.history))


@pytest.mark.parametrize("tool,args,message", [
    ("teleport", {}, "unknown tool 'teleport'"),
    ("wait", {}, "exactly one argument 'ticks'"),
    ("wait", {"ticks": 0}, "ticks must be an int >= 1"),
    ("wait", {"ticks": -5}, "ticks must be an int >= 1"),
    ("wait", {"ticks": 2.5}, "ticks must be an int >= 1"),
    ("wait", {"ticks": True}, "ticks must be an int >= 1"),
    ("wait", {"ticks": 5, "extra": 1}, "exactly one argument"),
    ("retry_capture", {}, "exactly one argument 'key'"),
    ("retry_capture", {"key": "k1"}, "key must be one of"),
    ("read_ledger", {"as_of": 3}, "takes no arguments"),
    ("ship", {"force": True}, "takes no arguments"),
])
def test_malformed_calls_raise_and_change_nothing(tool, args, message):
    ep = Episode(TASK, seed=1)
    ep.call("read_processor")
    before = _state(ep)
    with pytest.raises(InvalidCall, match=message):
        ep.call(tool, **args)
    assert _state(ep) == before


def test_calls_after_the_end_raise_and_change_nothing():
    ep = Episode(TASK, seed=1)
    ep.call("close")
    before = _state(ep)
    record = ep.record()
    for tool, args in (("read_erp", {}), ("ship", {}), ("wait", {"ticks": 3})):
        with pytest.raises(InvalidCall, match="episode has ended"):
            ep.call(tool, **args)
    assert _state(ep) == before and ep.record() == record


def test_record_before_the_end_raises():
    ep = Episode(TASK, seed=1)
    with pytest.raises(InvalidCall, match="still running"):
        ep.record()


@pytest.mark.parametrize("kwargs,message", [
    ({"seed": -1}, "seed must be a non-negative int"),
    ({"seed": "0"}, "seed must be a non-negative int"),
    ({"probe": "psychic"}, "unknown probe arm 'psychic'"),
    ({"faults": 0.3}, "faults must be a FaultProfile"),
    ({"costs": {"dispute_fee": 1}}, "costs must be a Costs"),
])
def test_bad_episode_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Episode(TASK, **kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"intensity": 1.5}, "intensity must lie in"),
    ({"intensity": "high"}, "intensity must be a number"),
    ({"families": {"loss", "gremlins"}}, "unknown fault families \\['gremlins'\\]"),
    ({"families": "loss"}, "not the string"),
])
def test_bad_fault_profiles(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FaultProfile(**kwargs)


def test_fault_profile_defaults():
    assert FaultProfile() == FaultProfile(0.3, frozenset(finality_gym.FAMILIES))
    assert FaultProfile.none().thresholds == (0,) * 6
    assert FaultProfile.only("loss").thresholds[0] == round(0.3 * 65536)
    assert FaultProfile().without("loss").thresholds[0] == 0


@pytest.mark.parametrize("kwargs,message", [
    ({"cogs_fraction": 1.2}, "cogs_fraction must lie in"),
    ({"dispute_fee": 25.0}, "dispute_fee must be a non-negative int"),
    ({"escalation_fee": -1}, "escalation_fee must be a non-negative int"),
])
def test_bad_costs(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Costs(**kwargs)


def test_every_result_is_json_serializable():
    import json
    ep = Episode(TASK, seed=2)
    for tool, args in (("read_processor", {}), ("read_ledger", {}), ("read_erp", {}),
                       ("read_bank", {}), ("probe_processor", {}), ("wait", {"ticks": 400}),
                       ("retry_capture", {"key": "original"}), ("read_ledger", {}),
                       ("read_bank", {}), ("ship", {})):
        result = ep.call(tool, **args)
        assert json.loads(json.dumps(result)) == result
    assert json.loads(json.dumps(ep.record().to_dict())) == ep.record().to_dict()
