"""A property-based fuzz over every position of a model endpoint's reply, served by a real HTTP
server on 127.0.0.1 and read by the real client: whatever the first reply is (a value replaced,
a member deleted or added, raw bytes no encoder writes), the episode ends as a graded row or as
the endpoint's infrastructure error, never as a traceback. The named hostile replies are
`test_model_replies.py`'s."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.model import MAX_ARGUMENT_DEPTH

from tests.model.chat_server import ChatServer
from tests.model.hostile_replies import DEEP, deep, first_turn, outcome
from tests.model.model_client import key  # noqa: F401  (the autouse fixture)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)
HOSTILE_TEXT = st.sampled_from([deep(DEEP), deep(MAX_ARGUMENT_DEPTH + 1), "{", "[1]", "null",
                                '{"ticks": NaN}', '{"ticks": 1e999}', "x" * 70_000, "",
                                '{"ticks": ' + "7" * 5000 + "}", '"\\"' * 3000, "\\", '"'])
RAW_VALUES = st.sampled_from([b"NaN", b"-Infinity", b"1e400", b'"\\udc80"', b'"\xff\xfe"',
                              b"9" * 5000, deep(DEEP).encode(), deep(70).encode(), b"-0",
                              b"1.0", b"[]", b"{}"])


def _paths(value, path=()):
    """Every position in a reply: (path, value) for each object member and array item."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, path + (index,))


CALL = ("choices", 0, "message", "tool_calls", 0)
# Positions drawn more often than the rest: where the model's own text is, and the counts.
TARGETS = [CALL + ("function", "arguments"), CALL + ("function", "name"), CALL + ("id",),
           ("usage", "prompt_tokens"), ("usage", "completion_tokens"),
           ("choices", 0, "message", "content")]


@st.composite
def mutations(draw):
    """A list of edits of the scripted reply: at a position (one of `TARGETS` half the time,
    else drawn from all of the reply's positions), a value replaced (by any JSON value, a
    hostile string, or raw bytes no encoder writes), a member deleted, or a member added."""
    return draw(st.lists(st.tuples(
        st.none() | st.sampled_from(TARGETS), st.integers(0, 10 ** 6),
        st.sampled_from(["replace", "delete", "add", "text", "raw"]),
        JSON, HOSTILE_TEXT, RAW_VALUES, st.text(max_size=6)), min_size=1, max_size=3))


def _at(reply, path) -> bool:
    try:
        for step in path[:-1]:
            reply = reply[step]
        return isinstance(reply, dict) and path[-1] in reply
    except (KeyError, IndexError, TypeError):
        return False


def mutate(reply: dict, edits) -> bytes:
    raws = {}
    for target, pick, how, value, text, raw_value, name in edits:
        paths = list(_paths(reply))
        path, _ = paths[pick % len(paths)]
        if target is not None and _at(reply, target):
            path = target
        if not path:  # the body itself
            if how == "raw":
                return raw_value
            reply = value if how == "replace" else reply
            if not isinstance(reply, dict):
                break
            continue
        parent = reply
        for step in path[:-1]:
            parent = parent[step]
        last = path[-1]
        if how == "delete" and isinstance(parent, dict):
            del parent[last]
        elif how == "delete":
            parent.pop(last)
        elif how == "add" and isinstance(parent, dict):
            parent[name or "extra"] = value
        elif how == "text":
            parent[last] = text
        elif how == "raw":
            marker = f"@raw{len(raws)}@"
            raws[marker] = raw_value
            parent[last] = marker
        else:
            parent[last] = value
    data = json.dumps(reply).encode()
    for marker, raw_value in raws.items():
        data = data.replace(json.dumps(marker).encode(), raw_value)
    return data


@pytest.fixture(scope="module")
def fuzz_server():
    state = {"edits": None, "seen": []}

    def rewrite(n, body, reply):
        if not first_turn(body) or state["edits"] is None:
            return None
        data = mutate(copy.deepcopy(reply), state["edits"])
        state["seen"].append(data)
        return data

    with ChatServer(policy="finality_gate", rewrite=rewrite) as server:
        yield server, state


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(edits=mutations())
def test_fuzz_any_reply_ends_as_a_row_or_an_infrastructure_error_never_a_traceback(
        fuzz_server, edits):
    """One request (no retry, a request cap of 1): whatever the first reply is, the episode
    ends as a graded row (the call ran, was answered as invalid, or there was none, and the
    request cap lapsed the case) or as the endpoint's infrastructure error; any other exception
    fails here."""
    server, state = fuzz_server
    state["edits"] = edits
    kind, got, stats = outcome(server, max_retries=0, max_requests=1)
    assert not server.errors
    if kind == "infrastructure":
        assert got.startswith("1 attempts failed; last: unreadable body"), got
    else:
        assert stats["requests"] == 1 and stats["invalid_turns"] in (0, 1), stats
