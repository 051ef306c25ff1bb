"""Every reply of a model endpoint is validated before it is believed. Hostile replies, served
by a real HTTP server on 127.0.0.1 (`tests/model/chat_server.py`'s `rewrite` hook) and read by the
real client (`agents.model.Endpoint` under `ModelPolicy`), each end either as the agent's
invalid call (a graded row; the run goes on) or as the endpoint's infrastructure failure
(retried, then no row and a message saying what was wrong), never as a traceback: a list of
named replies here, and the parsers themselves; a property-based fuzz over every position of a
reply in `test_model_reply_fuzz.py`, and the red team's cases through the command line in
`test_model_reply_redteam.py`."""

from __future__ import annotations

import json
import re

import pytest

from agents import run_episode
from agents.model import (MAX_ARGUMENT_BYTES, MAX_ARGUMENT_DEPTH, MAX_BODY_DEPTH, MAX_USAGE,
                          ModelPolicy, json_depth, parse_arguments)
from agents.model.replies import _NOT_BRACKET, _STRING
from eval.models.arm import Transcript, read_transcript
from finality_gym import InvalidCall, load_corpus

from tests.model.chat_server import ChatServer
from tests.model.hostile_replies import (DEEP, RECORD, TASK, at_first_turn, deep, gate_record,
                                         outcome)
from tests.model.model_client import config, key  # noqa: F401  (key: the autouse fixture)


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
def test_json_depth_counts_brackets_outside_strings():
    assert json_depth("") == 0 and json_depth("12") == 0 and json_depth("{}") == 1
    assert json_depth('{"a": [1, {"b": []}]}') == 4
    assert json_depth('{"a": "[[[[{{{{"}') == 1                  # brackets in a string
    assert json_depth('["\\"[[[", "\\\\", [[]]]') == 3            # escapes, an escaped backslash
    assert json_depth(deep(DEEP)) == DEEP
    assert json_depth('"' + "[" * 100) == 0                       # an unterminated string
    assert json_depth('"\\"' * 50_000) == 0
    assert json_depth('"abc\\') == 0
    assert json_depth('"\\"", ' * 1_000_000 + "[" * 10) == 10    # 6 MB of strings, then ten
    assert json_depth("[]," * 2_000_000) == 1


def _repeats(pattern: re.Pattern) -> set:
    """The kinds of repetition in a compiled pattern's parse tree (`MAX_REPEAT`: greedy,
    `MIN_REPEAT`: lazy, `POSSESSIVE_REPEAT`: never gives back)."""
    from re import _parser
    found, stack = set(), [_parser.parse(pattern.pattern, pattern.flags)]
    while stack:
        for op, arg in stack.pop():
            if "REPEAT" in str(op):
                found.add(str(op))
            for part in arg if isinstance(arg, (list, tuple)) else ():
                if isinstance(part, _parser.SubPattern):
                    stack.append(part)
                elif isinstance(part, (list, tuple)):
                    stack.extend(p for p in part if isinstance(p, _parser.SubPattern))
    return found


def test_json_depth_cannot_backtrack():
    """Linear time by construction, not by a clock: every repetition of the patterns
    `json_depth` scans with is possessive, so no input can make the scan go back."""
    for pattern in (_STRING, _NOT_BRACKET):
        assert _repeats(pattern) == {"POSSESSIVE_REPEAT"}, pattern.pattern
    assert _repeats(re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')) == {"MAX_REPEAT"}  # the reader sees


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
