"""Every reply of a model endpoint is validated before it is believed. Hostile replies, served
by a real HTTP server on 127.0.0.1 (`tests/chat_server.py`'s `rewrite` hook) and read by the
real client (`agents.model.Endpoint` under `ModelPolicy`, or `python -m eval model`), each end
either as the agent's invalid call (a graded row; the run goes on) or as the endpoint's
infrastructure failure (retried, then no row and a message saying what was wrong), never as a
traceback: a list of named replies, a property-based fuzz over every position of a reply, and
the red team's three cases through the command line."""

from __future__ import annotations

import copy
import json
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents import make_policy, run_episode
from agents.model import (MAX_ARGUMENT_BYTES, MAX_ARGUMENT_DEPTH, MAX_BODY_DEPTH, MAX_USAGE,
                          PREFLIGHT, Endpoint, InfrastructureError, ModelConfig, ModelPolicy,
                          json_depth, parse_arguments)
from eval import model_arm
from eval.__main__ import EXIT_INCOMPLETE, main
from eval.model_arm import Transcript, read_transcript
from eval.runfolder import read_rows
from finality_gym import InvalidCall, load_corpus

from chat_server import ChatServer

TASK = "pub-000b-pending_fail"
FAST = dict(timeout_s=30.0, backoff_s=0.001, backoff_max_s=0.01)
DEEP = 200_000  # the red team's depth
RECORD = ("disposition", "gap", "calls_used", "lapsed", "premature")


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("TEST_KEY", "test-key")
    monkeypatch.setenv("FINALITY_NO_PROGRESS", "1")


def config(server, **kw) -> ModelConfig:
    return ModelConfig(model="scripted-model", base_url=server.base_url, api_key_env="TEST_KEY",
                       **{**FAST, **kw})


def first_turn(body: dict) -> bool:
    """A request of an episode's first turn (every attempt of it), not the preflight."""
    messages = body.get("messages") or []
    return (not any(m.get("role") == "assistant" for m in messages)
            and not any(m.get("content") == PREFLIGHT for m in messages))


def at_first_turn(edit):
    """A `rewrite` hook: `edit` (the scripted reply, a copy, -> dict or bytes) answers every
    attempt of each episode's first turn; later turns are answered as the scripted model
    would."""
    return lambda n, body, reply: edit(copy.deepcopy(reply)) if first_turn(body) else None


def outcome(server, **kw) -> tuple[str, object, dict]:
    """The gate's case `TASK` played by the model behind `server`: ("row", record, stats) or
    ("infrastructure", message, stats). Any other exception is a failed test."""
    policy = ModelPolicy(config(server, **kw))
    try:
        record = run_episode(policy, load_corpus("public").task(TASK), 0)
    except InfrastructureError as exc:
        return "infrastructure", str(exc), policy.stats()
    return "row", record, policy.stats()


def gate_record():
    record = run_episode(make_policy("finality_gate"), load_corpus("public").task(TASK), 0)
    return {field: getattr(record, field) for field in RECORD}


# --------------------------------------------------------------------- the hostile replies
def _message(reply):
    return reply["choices"][0]["message"]


def _call(reply):
    return _message(reply)["tool_calls"][0]


def _function(reply):
    return _call(reply)["function"]


def put(getter, key, value):
    """An edit: `getter(reply)[key] = value` (a deletion when `value` is DELETE)."""
    def edit(reply):
        target = getter(reply)
        if value is DELETE:
            del target[key]
        else:
            target[key] = value
        return reply
    return edit


DELETE = object()
top = lambda reply: reply  # noqa: E731
usage = lambda reply: reply["usage"]  # noqa: E731


def raw(text: bytes):
    return lambda reply: text


def with_raw(placeholder: str, text: bytes, edit):
    """The reply after `edit`, with the JSON string `placeholder` replaced by raw `text` (what
    `json.dumps` cannot write: NaN, a lone surrogate, bytes not UTF-8, 200,000 brackets)."""
    def build(reply):
        data = json.dumps(edit(reply)).encode()
        marker = json.dumps(placeholder).encode()
        assert marker in data
        return data.replace(marker, text)
    return build


def usage_details(block, key, value):
    def edit(reply):
        reply["usage"][block] = {key: value}
        return reply
    return edit


def deep(n: int) -> str:
    return "[" * n + "]" * n


# The endpoint's failures: not a Chat Completions reply this harness can believe.
INFRASTRUCTURE = {
    "not_json": raw(b'{"choices": [ this is not json'),
    "empty_body": raw(b""),
    "not_utf8_not_json": raw(b"\xff\xfe\x00\x81 garbage"),
    "html": raw(b"<html><body>502 Bad Gateway</body></html>"),
    "body_null": raw(b"null"),
    "body_array": raw(b"[]"),
    "body_string": raw(b'"ok"'),
    "body_bom": lambda reply: b"\xef\xbb\xbf" + json.dumps(reply).encode(),
    "body_200k_deep": with_raw("@deep@", deep(DEEP).encode(), put(top, "extra", "@deep@")),
    "body_deeper_than_cap": with_raw("@deep@", deep(MAX_BODY_DEPTH).encode(),
                                     put(top, "extra", "@deep@")),
    "choices_missing": put(top, "choices", DELETE),
    "choices_null": put(top, "choices", None),
    "choices_empty": put(top, "choices", []),
    "choices_object": put(top, "choices", {"0": {"message": {}}}),
    "choices_string": put(top, "choices", "tool_calls"),
    "choice_null": put(top, "choices", [None]),
    "choice_string": put(top, "choices", ["hello"]),
    "second_choice_null": lambda reply: {**reply, "choices": reply["choices"] + [None]},
    "message_null": put(lambda r: r["choices"][0], "message", None),
    "message_missing": put(lambda r: r["choices"][0], "message", DELETE),
    "message_string": put(lambda r: r["choices"][0], "message", "wait 60"),
    "message_array": put(lambda r: r["choices"][0], "message", [{"role": "assistant"}]),
    "content_number": put(_message, "content", 5),
    "content_object": put(_message, "content", {"text": "hi"}),
    "content_array": put(_message, "content", [{"type": "text", "text": "hi"}]),
    "content_bool": put(_message, "content", False),
    "content_lone_surrogate": with_raw("@s@", b'"\\ud800"', put(_message, "content", "@s@")),
    "tool_calls_object": lambda r: put(_message, "tool_calls", _call(r))(r),
    "tool_calls_string": put(_message, "tool_calls", "wait"),
    "tool_calls_number": put(_message, "tool_calls", 1),
    "tool_call_null": put(_message, "tool_calls", [None]),
    "tool_call_string": put(_message, "tool_calls", ["wait"]),
    "tool_call_array": put(_message, "tool_calls", [["wait", "{}"]]),
    "id_number": put(_call, "id", 7),
    "id_object": put(_call, "id", {"id": "call_0"}),
    "function_null": put(_call, "function", None),
    "function_missing": put(_call, "function", DELETE),
    "function_string": put(_call, "function", "wait"),
    "name_null": put(_function, "name", None),
    "name_missing": put(_function, "name", DELETE),
    "name_number": put(_function, "name", 3),
    "name_array": put(_function, "name", ["wait"]),
    "arguments_number": put(_function, "arguments", 60),
    "arguments_array": put(_function, "arguments", [60]),
    "arguments_bool": put(_function, "arguments", True),
    "model_object": put(top, "model", {"name": "x"}),
    "model_number": put(top, "model", 4),
    "usage_array": put(top, "usage", [1, 2]),
    "usage_string": put(top, "usage", "100 tokens"),
    "usage_number": put(top, "usage", 100),
    "prompt_negative": put(usage, "prompt_tokens", -100_000),
    "completion_negative": put(usage, "completion_tokens", -1),
    "total_negative": put(usage, "total_tokens", -5),
    "prompt_float": put(usage, "prompt_tokens", 12.5),
    "prompt_float_integral": put(usage, "prompt_tokens", 12.0),
    "prompt_bool": put(usage, "prompt_tokens", True),
    "completion_bool_false": put(usage, "completion_tokens", False),
    "prompt_string": put(usage, "prompt_tokens", "12"),
    "prompt_object": put(usage, "prompt_tokens", {"n": 1}),
    "prompt_huge": put(usage, "prompt_tokens", MAX_USAGE + 1),
    "completion_huge": put(usage, "completion_tokens", 10 ** 30),
    "total_huge": put(usage, "total_tokens", 10 ** 18),
    "prompt_5000_digits": with_raw("@n@", b"9" * 5000, put(usage, "prompt_tokens", "@n@")),
    "prompt_nan": with_raw("@n@", b"NaN", put(usage, "prompt_tokens", "@n@")),
    "prompt_infinity": with_raw("@n@", b"-Infinity", put(usage, "prompt_tokens", "@n@")),
    "prompt_1e400": with_raw("@n@", b"1e400", put(usage, "prompt_tokens", "@n@")),
    "reasoning_negative": usage_details("completion_tokens_details", "reasoning_tokens", -7),
    "reasoning_float": usage_details("completion_tokens_details", "reasoning_tokens", 0.5),
    "cached_negative": usage_details("prompt_tokens_details", "cached_tokens", -3),
    "cached_bool": usage_details("prompt_tokens_details", "cached_tokens", True),
    "cached_huge": usage_details("prompt_tokens_details", "cached_tokens", 2 * MAX_USAGE),
    "details_string": put(usage, "completion_tokens_details", "none"),
    "details_array": put(usage, "prompt_tokens_details", [1]),
    "extra_field_nan": with_raw("@n@", b"NaN", put(_message, "score", "@n@")),
}

# The model's malformed calls: answered `invalid call: ...`, the world unchanged; the next
# reply is right, so the case is the gate's with one invalid turn.
PAD = "a" * (MAX_ARGUMENT_BYTES + 1)
INVALID = {
    "args_200k_deep": put(_function, "arguments", deep(DEEP)),  # 400 KB: the byte cap's
    "args_20k_deep": put(_function, "arguments", deep(20_000)),  # 40 KB: the depth cap's
    "args_200k_deep_object": put(_function, "arguments", '{"a":' * DEEP + "1" + "}" * DEEP),
    "args_one_past_the_depth_cap": put(_function, "arguments",
                                       '{"ticks": ' + deep(MAX_ARGUMENT_DEPTH) + "}"),
    "args_past_the_byte_cap": put(_function, "arguments", json.dumps({"pad": PAD})),
    "args_not_json": put(_function, "arguments", '{"ticks": 6'),
    "args_unterminated_string": put(_function, "arguments", '{"key": "orig\\'),
    "args_escaped_quotes": put(_function, "arguments", '"\\"' * 5000),
    "args_array": put(_function, "arguments", "[60]"),
    "args_string": put(_function, "arguments", '"60"'),
    "args_json_null": put(_function, "arguments", "null"),
    "args_5000_digits": put(_function, "arguments", '{"ticks": ' + "9" * 5000 + "}"),
    "args_nan": put(_function, "arguments", '{"ticks": NaN}'),
    "args_lone_surrogate": put(_function, "arguments", '{"key": "\\ud800"}'),
    "args_not_utf8": with_raw("@a@", b'"{\\"ticks\\": 6\xff}"', put(_function, "arguments",
                                                                     "@a@")),
    "args_unknown_keys": put(_function, "arguments", '{"verbose": true}'),
    "unknown_tool": put(_function, "name", "read_everything"),
    "empty_name": put(_function, "name", ""),
    "megabyte_name": put(_function, "name", "x" * (1 << 20)),
    "no_call_text": lambda r: put(_message, "tool_calls", DELETE)(put(_message, "content",
                                                                      "Let me think.")(r)),
    "no_call_null_content": put(_message, "tool_calls", None),
    "no_call_empty_list": put(_message, "tool_calls", []),
}

# Replies that are odd but readable, and right: the case is the gate's, no invalid turn.
READABLE = {
    "extra_fields_everywhere": lambda r: {
        **r, "system_fingerprint": None, "x": {"y": [1, {"z": None}]},
        "choices": [{**r["choices"][0], "logprobs": None, "x": [[]],
                     "message": {**_message(r), "refusal": None, "x": {"a": [True]},
                                 "tool_calls": [{**_call(r), "x": 1}]}}]},
    "no_usage": put(top, "usage", DELETE),
    "usage_null": put(top, "usage", None),
    "counts_null": lambda r: {**r, "usage": {"prompt_tokens": None, "completion_tokens": None,
                                             "total_tokens": None,
                                             "completion_tokens_details": None,
                                             "prompt_tokens_details": {"cached_tokens": None}}},
    "counts_zero": lambda r: {**r, "usage": {"prompt_tokens": 0, "completion_tokens": 0,
                                             "total_tokens": 0}},
    "counts_at_the_cap": put(usage, "prompt_tokens", MAX_USAGE),
    "model_missing": put(top, "model", DELETE),
    "content_empty": put(_message, "content", ""),
    "content_megabyte": put(_message, "content", "z" * (1 << 20)),
    "content_missing": put(_message, "content", DELETE),
    "content_not_utf8": with_raw("@c@", b'"caf\xe9"', put(_message, "content", "@c@")),
    "second_choice_ignored": lambda r: {**r, "choices": r["choices"] + [{"message": {}}]},
}


@pytest.fixture(scope="module")
def gate():
    return gate_record()


@pytest.mark.parametrize("name", list(INFRASTRUCTURE))
def test_an_unreadable_reply_is_retried_then_the_episodes_infrastructure_error(name):
    with ChatServer(policy="finality_gate", rewrite=at_first_turn(INFRASTRUCTURE[name])) as server:
        kind, got, stats = outcome(server, max_retries=1)
        assert server.turns == 2 and not server.errors  # two attempts of the first turn
    assert kind == "infrastructure", (name, got)
    assert got.startswith("2 attempts failed; last: unreadable body"), got
    assert len(got) < 800, got  # the reason and the start of the body, not the whole of it


def _graded_as_the_gate(reply, gate) -> dict:
    """A run whose first turn gets `reply`: graded, as the gate plays it; its stats."""
    with ChatServer(policy="finality_gate", rewrite=at_first_turn(reply)) as server:
        kind, record, stats = outcome(server)
        assert not server.errors
    assert kind == "row", record
    assert {field: getattr(record, field) for field in RECORD} == gate
    assert stats["agent_status"] == "ok", stats
    return {**stats, "calls_used": record.calls_used}


@pytest.mark.parametrize("name", list(INVALID))
def test_a_malformed_call_is_the_agents_invalid_call_and_the_case_goes_on(name, gate):
    stats = _graded_as_the_gate(INVALID[name], gate)
    assert stats["invalid_turns"] == 1, (name, stats)
    assert stats["requests"] == stats["calls_used"] + 1 and stats["retries"] == 0


@pytest.mark.parametrize("name", list(READABLE))
def test_an_odd_but_readable_reply_is_believed(name, gate):
    assert _graded_as_the_gate(READABLE[name], gate)["invalid_turns"] == 0, name


# Readable, but not what the strict test server takes back in the next request's history (it
# wants every call's id and its arguments as a string, as OpenAI does): one request each.
ONE_REQUEST = {
    "args_object": (put(_function, "arguments", {}), 0),
    "args_null": (put(_function, "arguments", None), 0),
    "args_missing": (put(_function, "arguments", DELETE), 0),
    "id_missing": (put(_call, "id", DELETE), 0),
    "id_null": (put(_call, "id", None), 0),
    "args_object_past_the_depth_cap": (
        put(_function, "arguments", {"a": json.loads(deep(MAX_ARGUMENT_DEPTH))}), 1),
    "args_object_past_the_byte_cap": (put(_function, "arguments", {"pad": PAD}), 1),
}


@pytest.mark.parametrize("name", list(ONE_REQUEST))
def test_readable_shapes_a_strict_server_would_not_take_back(name):
    edit, invalid = ONE_REQUEST[name]
    with ChatServer(policy="finality_gate", rewrite=at_first_turn(edit)) as server:
        kind, record, stats = outcome(server, max_requests=1)
        assert not server.errors and server.turns == 1
    assert kind == "row", (name, record)
    assert stats["invalid_turns"] == invalid and stats["requests"] == 1
    assert record.calls_used == 1 - invalid  # the gate's first call, probe_processor, or none


def test_what_an_invalid_call_is_told(tmp_path):
    """The answer names the limit, and quotes no more than the start of what the model sent."""
    told = {}
    for name in ("args_200k_deep", "args_20k_deep", "args_past_the_byte_cap",
                 "args_5000_digits", "megabyte_name"):
        with ChatServer(policy="finality_gate", rewrite=at_first_turn(INVALID[name])) as server:
            path = tmp_path / f"{name}.jsonl"
            run_episode(ModelPolicy(config(server), transcript=Transcript(path)),
                        load_corpus("public").task(TASK), 0)
        answer = read_transcript(path)[1]["new_messages"][1]
        assert answer["role"] == "tool"
        told[name] = json.loads(answer["content"])["error"]
        assert len(told[name]) < 500, told[name]
    assert f"400,000 bytes, more than the {MAX_ARGUMENT_BYTES:,}" in told["args_200k_deep"]
    assert f"20,000 deep, deeper than the {MAX_ARGUMENT_DEPTH}" in told["args_20k_deep"]
    assert f"more than the {MAX_ARGUMENT_BYTES:,}" in told["args_past_the_byte_cap"]
    assert "not valid JSON" in told["args_5000_digits"]
    assert "unknown tool" in told["megabyte_name"]


# --------------------------------------------------------------------- the parsers themselves
def test_json_depth_counts_brackets_outside_strings_in_linear_time():
    assert json_depth("") == 0 and json_depth("12") == 0 and json_depth("{}") == 1
    assert json_depth('{"a": [1, {"b": []}]}') == 4
    assert json_depth('{"a": "[[[[{{{{"}') == 1                  # brackets in a string
    assert json_depth('["\\"[[[", "\\\\", [[]]]') == 3            # escapes, an escaped backslash
    assert json_depth(deep(DEEP)) == DEEP
    assert json_depth('"' + "[" * 100) == 0                       # an unterminated string
    assert json_depth('"\\"' * 50_000) == 0                       # no quadratic backtracking
    assert json_depth('"abc\\') == 0
    started = time.perf_counter()
    json_depth('"\\"' * 2_000_000 + "[" * 10)                      # 6 MB in one pass
    json_depth("[]," * 2_000_000)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("text", [
    deep(MAX_ARGUMENT_DEPTH + 1),
    "{" + '"a":{' * MAX_ARGUMENT_DEPTH + "}" * MAX_ARGUMENT_DEPTH + "}",
    json.dumps({"pad": "a" * MAX_ARGUMENT_BYTES}), '{"a": NaN}', '{"a": Infinity}',
    '{"a": ' + "1" * 5000 + "}", "[1]", '"x"', "1", "true", "{", '{"a": 1} x'])
def test_arguments_over_a_limit_or_not_an_object_are_an_invalid_call(text):
    with pytest.raises(InvalidCall):
        parse_arguments(text)


def test_arguments_within_the_limits_are_read():
    within = {"a": json.loads(deep(MAX_ARGUMENT_DEPTH - 1))}
    assert parse_arguments(json.dumps(within)) == within
    assert parse_arguments(json.dumps({"pad": "a" * (MAX_ARGUMENT_BYTES - 20)}))
    assert parse_arguments("") == {} and parse_arguments(None) == {}
    assert parse_arguments({"ticks": 5}) == {"ticks": 5}
    with pytest.raises(InvalidCall, match="deeper than"):
        parse_arguments({"a": json.loads(deep(MAX_ARGUMENT_DEPTH))})


# --------------------------------------------------------------------- the fuzz
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


# --------------------------------------------------------------------- the red team's cases
def _arm(server, out, *more) -> int:
    return main(["model", "--model", "scripted-model", "--base-url", server.base_url,
                 "--api-key-env", "TEST_KEY", "--out", str(out), "--concurrency", "1",
                 "--workers", "1", "--timeout", "30", "--max-retries", "2", *more])


def every_turn(edit):
    """A `rewrite` hook: `edit` answers every request but the preflight."""
    return lambda n, body, reply: None if any(
        m.get("content") == PREFLIGHT for m in body.get("messages") or []) else edit(reply)


@pytest.mark.parametrize("caps", [["--max-total-tokens", "100"],
                                  ["--price-in", "2", "--price-out", "8", "--max-cost", "0.01"]],
                         ids=["max-total-tokens", "max-cost"])
def test_negative_usage_cannot_defeat_a_cap_it_is_an_infrastructure_error(tmp_path, capsys,
                                                                          caps):
    """The red team: every reply reports -100,000 prompt tokens; before, all 48 episodes ran
    under a 100-token cap and the summary reported a negative cost. Now the first episode's
    first turn is unreadable: retried, then no row, no new episode, exit 3; the same command
    against an honest server completes the run."""
    negative = lambda reply: {**reply, "usage": {**reply["usage"],  # noqa: E731
                                                 "prompt_tokens": -100_000}}
    with ChatServer(policy="finality_gate", rewrite=every_turn(negative)) as server:
        assert _arm(server, tmp_path, *caps) == EXIT_INCOMPLETE
        assert server.turns == 3  # the first turn's three attempts; nothing after them
    said = " ".join(capsys.readouterr().err.split())
    assert "usage.prompt_tokens is -100000" in said, said
    rows = read_rows(tmp_path / "episodes.jsonl") if (tmp_path / "episodes.jsonl").exists() else []
    assert rows == [] and not (tmp_path / "summary.json").exists()
    failed = json.loads((tmp_path / "incomplete.json").read_text())["episodes"]
    assert len(failed) == 1 and "usage.prompt_tokens is -100000" in failed[0]["error"]
    with ChatServer(policy="finality_gate") as server:
        code = _arm(server, tmp_path, *caps)
    rows = read_rows(tmp_path / "episodes.jsonl")
    if caps[0] == "--max-total-tokens":
        assert code == 0 and len(rows) == 48
        assert all(r["agent_status"] == "token_cap" and r["requests"] == 1 for r in rows)
    else:  # one episode's tokens cost more than a cent: the budget stops the run, honestly
        assert code == EXIT_INCOMPLETE and rows
        assert all(r["cost_microusd"] > 0 for r in rows)


def test_200k_deep_arguments_are_an_invalid_call_and_the_run_goes_on(tmp_path):
    """The red team: 200,000-deep JSON arguments crashed the run with a RecursionError. Now
    they are the model's invalid call: two episodes get one invalid turn each, every episode
    is graded, each as the gate plays it."""
    hostile = []

    def rewrite(n, body, reply):  # the first turns of the first two episodes (one request each)
        if not first_turn(body) or len(hostile) == 2:
            return None
        hostile.append(n)
        reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = deep(DEEP)
        return reply

    with ChatServer(policy="finality_gate", rewrite=rewrite) as server:
        assert _arm(server, tmp_path) == 0
        assert not server.errors
    rows = read_rows(tmp_path / "episodes.jsonl")
    assert len(rows) == len(model_arm.stratified_subset("public")) == 48
    assert sorted(r["invalid_turns"] for r in rows) == [0] * 46 + [1, 1]
    scripted = {(r["task_id"], r["seed"]): r
                for r in read_rows(tmp_path / "scripted" / "episodes.jsonl")
                if r["policy"] == "finality_gate"}
    for row in rows:
        want = scripted[(row["task_id"], row["seed"])]
        assert {f: row[f] for f in RECORD} == {f: want[f] for f in RECORD}
    assert (tmp_path / "summary.json").exists()


def test_a_null_message_is_an_infrastructure_error_after_the_retries(tmp_path, capsys):
    """The red team: `"message": null` crashed the run with an AttributeError. Now it is
    unreadable: three attempts, then the episode's infrastructure error (exit 3, listed in
    incomplete.json), and a re-run completes it."""
    def null_message(n, body, reply):  # every attempt of the first episode's first turn
        if first_turn(body) and server.turns <= 3:
            reply["choices"][0]["message"] = None
            return reply
        return None

    with ChatServer(policy="finality_gate", rewrite=null_message) as server:
        assert _arm(server, tmp_path) == EXIT_INCOMPLETE
        assert server.turns == 3 and not server.errors
    said = " ".join(capsys.readouterr().err.split())
    assert "3 attempts failed; last: unreadable body (choices[0].message is null" in said, said
    failed = json.loads((tmp_path / "incomplete.json").read_text())["episodes"]
    assert len(failed) == 1 and "choices[0].message is null" in failed[0]["error"]
    with ChatServer(policy="finality_gate") as server:
        assert _arm(server, tmp_path) == 0
    assert len(read_rows(tmp_path / "episodes.jsonl")) == 48


def test_an_unreadable_preflight_stops_the_run_saying_so(tmp_path, capsys):
    with ChatServer(policy="finality_gate",
                    rewrite=lambda n, body, reply: {**reply, "choices": []}) as server:
        assert _arm(server, tmp_path) == 2
        assert server.turns == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "choices is an empty array" in said and "not Chat Completions replies" in said, said


def test_a_recorded_turn_is_checked_again_when_it_is_replayed(tmp_path):
    """A transcript written before these checks (a negative count in it) is not believed on
    replay: the episode's infrastructure error says to move the file away."""
    path = tmp_path / "t.jsonl"
    task = load_corpus("public").task(TASK)
    with ChatServer(policy="finality_gate") as server:
        run_episode(ModelPolicy(config(server), transcript=Transcript(path)), task, 0)
        lines = read_transcript(path)
        lines[0]["response"]["usage"]["prompt_tokens"] = -5
        lines[0]["usage"]["prompt_tokens"] = -5
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        policy = ModelPolicy(config(server), transcript=Transcript(path))
        with pytest.raises(InfrastructureError, match="move the transcript away"):
            run_episode(policy, task, 0)


def test_the_endpoint_itself_refuses_an_unreadable_body_and_keeps_a_readable_one():
    """`Endpoint.complete` alone, as the preflight and every turn use it."""
    request = {"model": "scripted-model", "messages": [{"role": "user", "content": PREFLIGHT}]}
    with ChatServer(rewrite=lambda n, body, reply: None if n % 2 else {
            **reply, "usage": {"prompt_tokens": True}}) as server:
        endpoint = Endpoint(config(server, max_retries=1))
        body, _, attempts, errors = endpoint.complete(request, random.Random(0))
    assert attempts == 2 and "usage.prompt_tokens is true" in errors[0], errors
    assert body["choices"][0]["message"]["content"] == "ready"
