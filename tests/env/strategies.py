"""Hypothesis strategies shared by the property tests: tasks, profiles, tool sequences."""

from hypothesis import strategies as st

import finality_gym
from finality_gym.faults import FAMILIES

PUBLIC = finality_gym.load_corpus("public")
REGENERATED = finality_gym.load_corpus("regenerated")
ALL_TASKS = PUBLIC.tasks + REGENERATED.tasks
TWIN_PAIRS = [u for c in (PUBLIC, REGENERATED) for u in c.units if len(u) == 2]

tasks = st.sampled_from(ALL_TASKS)
twin_pairs = st.sampled_from(TWIN_PAIRS)
seeds = st.integers(min_value=0, max_value=2**31)
profiles = st.builds(
    finality_gym.FaultProfile,
    intensity=st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0]),
    families=st.frozensets(st.sampled_from(FAMILIES)),
)
_call = st.one_of(
    st.sampled_from([("read_processor", {}), ("read_ledger", {}), ("read_erp", {}),
                     ("read_bank", {}), ("probe_processor", {}), ("ship", {}), ("refund", {}),
                     ("write_off", {}), ("escalate", {}), ("close", {})]),
    st.builds(lambda n: ("wait", {"ticks": n}), st.integers(min_value=1, max_value=400)),
    st.builds(lambda k: ("retry_capture", {"key": k}), st.sampled_from(["original", "fresh"])),
)
calls = st.lists(_call, max_size=45)
# Sequences with no disposition: they run until the budget or the horizon ends the case.
_non_terminal = _call.filter(lambda c: c[0] not in finality_gym.episode.DISPOSITIONS)
open_calls = st.lists(_non_terminal, max_size=45)


def play(episode, sequence):
    """Run a fixed call sequence until it ends or the episode does; return the results."""
    results = []
    for tool, args in sequence:
        if episode.done:
            break
        results.append(episode.call(tool, **args))
    return results
