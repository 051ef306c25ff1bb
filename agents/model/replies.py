"""What a reply may be, and whose failure it is when it is not that. Every reply is checked
before it is believed (`read_body`, `check_reply`), and its tool calls are parsed
(`parse_call`) before the engine sees them:
- The endpoint's (an unreadable body, retried like a timeout, then the episode's
  `InfrastructureError`: no row, the episode listed in `incomplete.json`, resumable): a body
  that is not JSON (`NaN` and `Infinity` are not), or nests arrays and objects deeper than
  `MAX_BODY_DEPTH` (counted by a linear scan of its brackets before it is parsed, so a parser
  never recurses that deep), or holds a string that is not Unicode (a lone surrogate: it could
  not be sent back), or is not an object; `choices` not a non-empty array of objects; its first
  `message` not an object; `content` neither a string nor null; `tool_calls` neither an array
  nor null, or an item of it not an object, its `id` neither a string nor null, its `function`
  not an object, its `function.name` not a string, its `function.arguments` neither a string,
  an object nor null; `model` neither a string nor null; `usage` neither an object nor null,
  or a count the harness reads (`prompt_tokens`, `completion_tokens`, `total_tokens`,
  `completion_tokens_details.reasoning_tokens`, `prompt_tokens_details.cached_tokens`; null
  or missing is 0) anything but an integer from 0 to `MAX_USAGE` (10^9): a boolean, a float
  (`12.0` too), a string, a negative or larger number is unreadable, so no count can take a
  cap (`max_total_tokens`, `--max-cost`) backwards. A reply the client did not get over HTTP
  (replayed from a transcript, or from another endpoint such as inspect's) is checked the same
  way, and one that fails is the episode's `InfrastructureError` at once.
- The model's (an invalid call: answered, nothing happens, counted against
  `max_invalid_turns`; the case goes on): a tool call well formed as the protocol has it whose
  content is wrong: an unknown tool name (one longer than `MAX_TOOL_NAME` is quoted only in
  part), arguments longer than `MAX_ARGUMENT_BYTES` (64 KiB as UTF-8) or nesting deeper than
  `MAX_ARGUMENT_DEPTH` (32; counted by the same scan before they are parsed), arguments that
  are not valid JSON (an integer of more than 4,300 digits, `NaN` included) or not an object,
  arguments the engine rejects; and a reply with no tool call at all.
The endpoint's rules come first: a reply unreadable anywhere is the endpoint's failure even if
it also carries a malformed call. Bytes that are not UTF-8 are read as U+FFFD (httpx decodes
the body so), which makes a body unreadable only where its JSON then fails. Fields the harness
does not read (`finish_reason`, `refusal`, what the choices after the first hold, a provider's
own fields) are not checked: they go back, or into the transcript, as they came.
"""

from __future__ import annotations

import itertools
import json
import re

from finality_gym import InvalidCall
from finality_gym.episode import TOOLS, check_call

from .errors import UnreadableReply

MAX_USAGE = 10 ** 9              # the most tokens any one count of a reply's usage may say
MAX_BODY_DEPTH = 64              # arrays and objects in a response body (a reply needs 8)
MAX_ARGUMENT_DEPTH = 32          # arrays and objects in a tool call's arguments (ours need 1)
MAX_ARGUMENT_BYTES = 64 << 10    # a tool call's arguments as UTF-8 (ours need some 20 bytes)
MAX_TOOL_NAME = 64               # characters of an unknown tool's name quoted back (OpenAI's cap)


# Possessive quantifiers (`*+`): neither pattern can give back what it matched, so neither can
# backtrack, whatever the text (the tests read the compiled patterns for that).
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+(?:"|\\?+\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON `text`, found without parsing it: one linear
    scan that drops its strings, then counts its brackets (`json.loads` recurses once a
    level: 200,000 levels raise `RecursionError`, or worse under a raised recursion limit).
    For text that is not JSON, the count is at least as deep as a parser would go before it
    fails. An unterminated string runs to the end, and neither pattern can backtrack (its
    quantifiers are possessive), so the scan stays linear whatever the text."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(0, max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0))


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _shown(value) -> str:
    """A JSON value as a message names it, briefly."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, float) or isinstance(value, int) and abs(value) < 10 ** 30:
        return repr(value)
    if isinstance(value, int):
        return f"an integer of some {round(value.bit_length() * 0.30103)} digits"
    if isinstance(value, str):
        return f"a string ({value[:40]!r}{'...' if len(value) > 40 else ''})"
    if isinstance(value, list):
        return "an array" if value else "an empty array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def read_body(text: str) -> dict:
    """A 200 response's body as the reply it must be (`check_reply`); `UnreadableReply`
    saying why not."""
    depth = json_depth(text)
    if depth > MAX_BODY_DEPTH:
        raise UnreadableReply(f"arrays and objects nest {depth:,} deep, deeper than the "
                              f"{MAX_BODY_DEPTH} a reply may")
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise UnreadableReply(f"not JSON: {str(exc)[:120]}") from None
    check_reply(body)
    return body


def check_reply(body) -> dict:
    """Check a parsed reply before anything of it is believed (the rules are the module's
    docstring's); return its usage (`usage_of`). `UnreadableReply` says what is wrong."""
    if not isinstance(body, dict):
        raise UnreadableReply(f"the body is {_shown(body)}, not an object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise UnreadableReply(f"choices is {_shown(choices)}, not a non-empty array")
    for i, choice in enumerate(choices):
        if not isinstance(choice, dict):
            raise UnreadableReply(f"choices[{i}] is {_shown(choice)}, not an object")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise UnreadableReply(f"choices[0].message is {_shown(message)}, not an object")
    _kind(message, "content", "choices[0].message", (str,), "a string or null")
    calls = _kind(message, "tool_calls", "choices[0].message", (list,), "an array or null")
    for k, call in enumerate(calls or ()):
        where = f"choices[0].message.tool_calls[{k}]"
        if not isinstance(call, dict):
            raise UnreadableReply(f"{where} is {_shown(call)}, not an object")
        _kind(call, "id", where, (str,), "a string or null")
        function = call.get("function")
        if not isinstance(function, dict):
            raise UnreadableReply(f"{where}.function is {_shown(function)}, not an object")
        if not isinstance(function.get("name"), str):
            raise UnreadableReply(f"{where}.function.name is {_shown(function.get('name'))}, "
                                  "not a string")
        _kind(function, "arguments", f"{where}.function", (str, dict),
              "a string, an object or null")
    _kind(body, "model", "the body", (str,), "a string or null")
    usage = usage_of(body)
    try:  # a lone surrogate: neither the next request nor a UTF-8 file could carry it
        json.dumps(body, ensure_ascii=False).encode()
    except (UnicodeEncodeError, ValueError, RecursionError) as exc:
        raise UnreadableReply(f"a string that is not Unicode ({str(exc)[:80]})") from None
    return usage


def _kind(holder: dict, key: str, where: str, types: tuple, wanted: str):
    value = holder.get(key)
    if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
        raise UnreadableReply(f"{where}.{key} is {_shown(value)}, not {wanted}")
    return value


def usage_of(body: dict) -> dict:
    """A response's token counts: prompt and completion tokens, and the reasoning and cached
    tokens among them where the server reports them (`completion_tokens_details`,
    `prompt_tokens_details`). A count that is missing or null is 0; one that is not an integer
    from 0 to `MAX_USAGE` (a boolean is not) is `UnreadableReply`, and so is `total_tokens`,
    though it is not kept."""
    usage = body.get("usage")
    if usage is None:
        usage = {}
    if not isinstance(usage, dict):
        raise UnreadableReply(f"usage is {_shown(usage)}, not an object or null")
    counts = {"prompt_tokens": _count(usage, "prompt_tokens", "usage"),
              "completion_tokens": _count(usage, "completion_tokens", "usage")}
    _count(usage, "total_tokens", "usage")
    for key, details in (("reasoning_tokens", "completion_tokens_details"),
                         ("cached_tokens", "prompt_tokens_details")):
        block = usage.get(details)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise UnreadableReply(f"usage.{details} is {_shown(block)}, not an object or null")
        value = _count(block, key, f"usage.{details}")
        if value:
            counts[key] = value
    return counts


def _count(holder: dict, key: str, where: str) -> int:
    value = holder.get(key)
    if value is None:
        return 0
    if type(value) is not int or not 0 <= value <= MAX_USAGE:
        raise UnreadableReply(f"{where}.{key} is {_shown(value)}, not a token count (an integer "
                              f"from 0 to {MAX_USAGE:,})")
    return value


def parse_arguments(raw) -> dict:
    """A tool call's arguments as an object; `InvalidCall` if they are not one, or are longer
    than `MAX_ARGUMENT_BYTES` or nest deeper than `MAX_ARGUMENT_DEPTH` (both checked before
    they are parsed: nothing here recurses with the depth the model chose)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):  # a server that parsed them already (its body's depth is capped)
        text = json.dumps(raw)
    elif isinstance(raw, str):
        text = raw
    else:
        raise InvalidCall(f"arguments must be a JSON object, got {type(raw).__name__}")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_ARGUMENT_BYTES:
        raise InvalidCall(f"arguments are {size:,} bytes, more than the {MAX_ARGUMENT_BYTES:,} "
                          f"a call may carry: {text[:80]!r}")
    depth = json_depth(text)
    if depth > MAX_ARGUMENT_DEPTH:
        raise InvalidCall(f"arguments nest arrays and objects {depth:,} deep, deeper than the "
                          f"{MAX_ARGUMENT_DEPTH} a call may: {text[:80]!r}")
    if isinstance(raw, dict):
        return raw
    try:
        args = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InvalidCall(f"arguments are not valid JSON ({exc.msg} at {exc.pos}): {raw[:80]!r}")
    except (ValueError, RecursionError) as exc:  # 4,301 digits, NaN
        raise InvalidCall(f"arguments are not valid JSON ({str(exc)[:100]}): {raw[:80]!r}")
    if not isinstance(args, dict):
        raise InvalidCall(f"arguments must be a JSON object, got {raw[:80]!r}")
    return args


def parse_call(call: dict) -> tuple[str, dict]:
    """A tool call (`check_reply` has checked its shape) as (tool, arguments); `InvalidCall`,
    the model's error, if it cannot be made."""
    function = call.get("function") or {}
    tool = function.get("name")
    if not isinstance(tool, str):
        raise InvalidCall("a tool call without a function name")
    if len(tool) > MAX_TOOL_NAME:  # no tool's name is that long: not quoted back whole
        raise InvalidCall(f"unknown tool {tool[:MAX_TOOL_NAME]!r}... (a name of {len(tool):,} "
                          f"characters); valid tools: {', '.join(TOOLS)}")
    args = parse_arguments(function.get("arguments"))
    check_call(tool, args)
    return tool, args
