"""The scripted model's rules and words, for `tests/model/chat_server.py`: OpenAI's rules for a
conversation with tool calls (`validate`), the case brief read back from a conversation
(`brief_of`) and the calls the conversation made (`call_of`, `world_result`), the replies that
misbehave (`MISBEHAVIOURS`, `emit`), and the providers' own ways (`reasoning_terms`,
`check_signatures`, `fits`), each refusal an `HTTPError` in OpenAI's shape. A test helper, not a
test module."""

from __future__ import annotations

import hashlib
import json
from typing import Callable, Mapping

from agents import Brief
from agents.model import PREFLIGHT
from finality_gym.episode import check_call
from finality_gym.world import DISPOSITIONS

OVERFLOW_STYLES = ("openai", "vllm", "llamacpp", "anthropic", "413")
WAIT_ONLY = ("string_int", "float_int", "empty_args_for_wait", "empty_object_for_wait")
MISBEHAVIOURS = ("unknown_tool", "bad_json", "text_only", "wrong_args", "string_int", "float_int",
                 "empty_args_for_wait", "empty_object_for_wait", "trailing_call",
                 "invalid_then_call")
UNKNOWN_TOOL = "read_everything"
TEXT_ONLY = "Let me think about it."
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def misbehave_schedule(kinds: Mapping[int, str]) -> Callable[[int, tuple], str | None]:
    """A `misbehave` hook from {turn: kind}."""
    for kind in kinds.values():
        if kind not in MISBEHAVIOURS:
            raise ValueError(f"unknown misbehaviour {kind!r}; valid: {', '.join(MISBEHAVIOURS)}")
    kinds = dict(kinds)
    return lambda turn, call: kinds.get(turn)


class HTTPError(Exception):
    """A refusal as OpenAI words one (`body()`): raised by the rules, answered by the handler."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status, message, type_, code, param)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def error_kind(status: int) -> tuple[str, str | None]:
    """The error body's `type` and `code` OpenAI gives an injected status."""
    if status == 429:
        return "requests", "rate_limit_exceeded"
    if status >= 500:
        return "server_error", None
    return "invalid_request_error", None


REASONING_TOKENS = 7  # per reply of a reasoning model


def reasoning_terms(body: dict) -> None:
    """An OpenAI reasoning model's refusals, in its words."""
    if "max_tokens" in body:
        raise HTTPError(400, "Unsupported parameter: 'max_tokens' is not supported with this "
                              "model. Use 'max_completion_tokens' instead.",
                         code="unsupported_parameter", param="max_tokens")
    if body.get("temperature", 1) != 1:
        raise HTTPError(400, f"Unsupported value: 'temperature' does not support "
                              f"{body['temperature']} with this model. Only the default (1) "
                              "value is supported.", code="unsupported_value",
                         param="temperature")


def signature(call_id: str) -> str:
    return "sig-" + hashlib.sha256(call_id.encode()).hexdigest()[:24]


def check_signatures(messages: list) -> None:
    """Gemini's rule: every tool call of the history comes back with its thought signature."""
    for i, m in enumerate(messages):
        for tc in m.get("tool_calls") or [] if m.get("role") == "assistant" else []:
            extra = tc.get("extra_content") if isinstance(tc, dict) else None
            got = ((extra or {}).get("google") or {}).get("thought_signature")
            if got != signature(tc.get("id", "")):
                raise HTTPError(400, f"Function call is missing a thought_signature in "
                                      f"functionCall parts (messages[{i}], call "
                                      f"{tc.get('id')!r}). This is required for tools to work "
                                      "correctly.", type_="INVALID_ARGUMENT")


def fits(messages: list, body: dict, window: int, style: str) -> None:
    """Refuse a request that does not fit a `window`-token context, as `style`'s server does."""
    given = len(json.dumps(messages)) // 4
    wanted = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
    if given + wanted <= window:
        return
    if style == "413":
        raise HTTPError(413, "Request Entity Too Large", type_="request_too_large")
    if style == "openai":
        raise HTTPError(400, f"This model's maximum context length is {window} tokens. However, "
                              f"your messages resulted in {given + wanted} tokens. Please reduce "
                              "the length of the messages.", code="context_length_exceeded",
                         param="messages")
    if style == "vllm":
        raise HTTPError(400, f"This model's maximum context length is {window} tokens. However, "
                              f"you requested {given + wanted} tokens ({given} in the messages, "
                              f"{wanted} in the completion). Please reduce the length of the "
                              "messages or completion.", type_="BadRequestError")
    if style == "llamacpp":
        raise HTTPError(400, f"request ({given + wanted} tokens) exceeds the available context "
                              f"size ({window} tokens), try increasing it",
                         type_="exceed_context_size_error")
    raise HTTPError(400, f"prompt is too long: {given + wanted} tokens > {window} maximum")


def is_preflight(messages) -> bool:
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") == "user" and m.get("content") == PREFLIGHT
        for m in messages)


def validate(messages) -> None:
    """OpenAI's rules for a conversation with tool calls."""
    if not isinstance(messages, list) or not messages:
        raise HTTPError(400, "'messages' must be a non-empty array", param="messages")
    pending: dict[str, bool] | None = None  # the last assistant message's call ids: answered?
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise HTTPError(400, f"Invalid value for 'messages[{i}].role': expected one of "
                                  f"{', '.join(sorted(_ROLES))}", param=f"messages[{i}].role")
        role = m["role"]
        if role == "tool":
            if pending is None:
                raise HTTPError(400, "Invalid parameter: messages with role 'tool' must be a "
                                      "response to a preceding message with 'tool_calls'.",
                                 param=f"messages.[{i}].role")
            call_id = m.get("tool_call_id")
            if call_id not in pending:
                raise HTTPError(400, f"Invalid parameter: 'tool_call_id' of '{call_id}' not "
                                      "found in 'tool_calls' of previous message.",
                                 param=f"messages.[{i}].tool_call_id")
            if pending[call_id]:
                raise HTTPError(400, f"Invalid parameter: 'tool_call_id' of '{call_id}' is "
                                      "answered twice.", param=f"messages.[{i}].tool_call_id")
            pending[call_id] = True
            continue
        _check_answered(pending, i)
        pending = None
        if role == "assistant" and m.get("tool_calls"):
            pending = {}
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise HTTPError(400, f"'messages[{i}].tool_calls' must be an array")
            for k, tc in enumerate(calls):
                function = tc.get("function") if isinstance(tc, dict) else None
                if (not isinstance(tc.get("id") if isinstance(tc, dict) else None, str)
                        or tc.get("type") != "function" or not isinstance(function, dict)
                        or not isinstance(function.get("name"), str)
                        or not isinstance(function.get("arguments"), str)):
                    raise HTTPError(400, f"Invalid 'messages[{i}].tool_calls[{k}]': a tool call "
                                          "needs a string 'id', type 'function' and a function "
                                          "with a string 'name' and string 'arguments'")
                if tc["id"] in pending:
                    raise HTTPError(400, f"Duplicate tool call id '{tc['id']}' in "
                                          f"'messages[{i}].tool_calls'")
                pending[tc["id"]] = False
    _check_answered(pending, len(messages))


def _check_answered(pending: dict | None, i: int) -> None:
    if pending is None:
        return
    missing = [call_id for call_id, answered in pending.items() if not answered]
    if missing:
        raise HTTPError(400, "An assistant message with 'tool_calls' must be followed by tool "
                              "messages responding to each 'tool_call_id'. The following "
                              f"tool_call_ids did not have response messages: {', '.join(missing)}",
                         param=f"messages.[{i}]")


def brief_of(messages: list) -> Brief:
    for m in messages:
        if m["role"] == "user":
            text = m.get("content")
            break
    else:
        raise HTTPError(400, "the conversation has no user message with the case brief")
    try:
        fields, _ = json.JSONDecoder().raw_decode(text, text.index("{"))
        return Brief(order_value=fields["order_value"], handover_at=fields["now"],
                     ship_by=fields["ship_by"], horizon=fields["horizon"],
                     budget=fields["calls_left"], probe=fields["probe_arm"], seed=0)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise HTTPError(400, f"the first user message holds no case brief ({exc})") from None


def world_result(content) -> dict | None:
    try:
        result = json.loads(content)
    except (TypeError, ValueError):
        return None
    return result if isinstance(result, dict) and "t" in result else None


def call_of(tc: dict) -> tuple[str, dict] | None:
    raw = tc["function"]["arguments"]
    try:
        args = json.loads(raw) if raw not in ("", "null") else {}
    except ValueError:
        return None
    return (tc["function"]["name"], args) if isinstance(args, dict) else None


def same(made: tuple, call: tuple) -> bool:
    # canonical JSON, so that 60.0 is not 60 and True is not 1
    return made[0] == call[0] and (json.dumps(made[1], sort_keys=True)
                                   == json.dumps(call[1], sort_keys=True))


def show(call) -> str:
    return "nothing (the policy has ended)" if call is None else f"{call[0]}({json.dumps(call[1])})"


def ends_case(policy, call: tuple[str, dict]) -> bool:
    """Whether `call`, made now, ends the case (`Episode.call`'s rules, from the clock and the
    budget the scripted policy keeps)."""
    tool, args = call
    brief = policy.brief
    if tool in DISPOSITIONS and not (tool == "ship" and policy.now > brief.ship_by):
        return True
    return policy.calls_left <= 1 or policy.now + check_call(tool, args) >= brief.horizon


def _tool_call(turn: int, k: int, name: str, arguments: str) -> dict:
    return {"id": f"call_{turn}_{k}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def emit(turn: int, call: tuple[str, dict], kind: str | None) -> tuple[str | None, list]:
    """The reply's content and tool calls for the next call under a misbehaviour."""
    tool, args = call
    right = _tool_call(turn, 0, tool, json.dumps(args))
    is_wait = tool == "wait"
    if kind is None:
        return None, [right]
    if kind == "unknown_tool":
        return None, [_tool_call(turn, 0, UNKNOWN_TOOL, "{}")]
    if kind == "bad_json":
        return None, [_tool_call(turn, 0, tool, '{"ticks": 6')]
    if kind == "text_only":
        return TEXT_ONLY, []
    if kind == "wrong_args":
        return None, [_tool_call(turn, 0, tool, json.dumps({**args, "verbose": True}))]
    if kind == "string_int" and is_wait:
        return None, [_tool_call(turn, 0, tool, json.dumps({"ticks": str(args["ticks"])}))]
    if kind == "float_int" and is_wait:
        return None, [_tool_call(turn, 0, tool, json.dumps({"ticks": float(args["ticks"])}))]
    if kind == "empty_args_for_wait" and is_wait:
        return None, [_tool_call(turn, 0, tool, "")]
    if kind == "empty_object_for_wait" and is_wait:
        return None, [_tool_call(turn, 0, tool, "{}")]
    if kind == "trailing_call":
        return None, [right, _tool_call(turn, 1, "read_bank", "{}")]
    if kind == "invalid_then_call":
        return None, [_tool_call(turn, 0, UNKNOWN_TOOL, "{}"),
                      _tool_call(turn, 1, tool, json.dumps(args))]
    if kind in MISBEHAVIOURS:  # a wait-only kind when the next call is not a wait
        return None, [right]
    raise ValueError(f"misbehave returned an unknown kind {kind!r}; valid: "
                     f"{', '.join(MISBEHAVIOURS)}")
