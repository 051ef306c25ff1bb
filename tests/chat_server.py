"""A real OpenAI-compatible Chat Completions server on 127.0.0.1 with a scripted model behind it,
for the model arm's tests and its speed benchmark. A test helper, not a test module.

    with ChatServer(policy="finality_gate", faults=fault_schedule({0: Fault("drop")})) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0)

The scripted model plays a scripted policy (`agents.make_policy(spec)`; only policies that do
not use `brief.seed` are meaningful, since the brief message carries no seed). On every request
it reads the brief from the first user message (the JSON object from its first `{`), replays the
conversation through a fresh policy (every tool result with a `"t"` is a world result and must
answer the call the policy made; results without one are harness error answers and are
skipped), and emits the policy's next call as one tool call `call_<turn>_<k>`, where `turn` is
the number of assistant messages already in the conversation. A conversation whose user message
is `agents.model.PREFLIGHT` is answered with the text "ready".

The server is strict the way OpenAI is: a bearer key, a known model, `tools` on every
non-preflight request, and every tool call id answered exactly once by the tool messages right
after its assistant message (400 naming the id otherwise). A conversation that left the
scripted policy's path is a 400 that says so.

Hooks, both optional:
- `faults(n, body) -> Fault | None`, for the n-th chat request (from 0, over every POST to
  /v1/chat/completions, preflights included, in arrival order), consulted right after the body
  is read: an error status with an OpenAI-style body and headers, a dropped connection, an
  unreadable 200 body, a stall before the normal answer, a trickle (the headers, or only part
  of them, then one byte at a time), or a flood (an answer hundreds of MB long, streamed).
- `misbehave(turn, next_call) -> kind | None`, per scripted-model reply: one of `MISBEHAVIOURS`,
  a malformed reply instead of or besides the right call. The `*_for_wait`, `string_int` and
  `float_int` kinds apply only when the next call is a `wait`, and `trailing_call` only when the
  next call ends the case (a disposition other than a refused late `ship`, the budget's last
  call, or a call that reaches the horizon: the scripted policy knows the clock and the budget);
  otherwise the right call goes out alone.

A reply, optional: `rewrite(n, body, reply) -> dict | bytes | None`, for the n-th chat request
(numbered as for `faults`) that the scripted model answered with a 200: the `reply` it would
send, replaced by the dict returned (sent as JSON) or by the bytes returned, sent as they are (a
body that `json.dumps` cannot write: 200,000 brackets deep, not UTF-8, `NaN`); None sends the
reply. A hostile endpoint's replies, for `tests/test_model_replies.py`.

Provider behaviours, optional: `reasoning=True` answers as an OpenAI reasoning model does
(`max_tokens` refused with 400 `unsupported_parameter`, naming `max_completion_tokens`; a
`temperature` but 1 refused with 400 `unsupported_value`; usage with
`completion_tokens_details.reasoning_tokens` and `prompt_tokens_details.cached_tokens`);
`signatures=True` as Gemini's OpenAI-compatible endpoint does (each tool call carries
`extra_content.google.thought_signature`, and a later request whose history lacks one, or
alters it, is a 400).

A context window, optional: `context_tokens=N` refuses a request whose messages (4 characters a
token) and `max_tokens` (or `max_completion_tokens`) together exceed N, the way a real server
says it (`overflow`, one of `OVERFLOW_STYLES`): OpenAI's 400 `context_length_exceeded`, vLLM's
and llama.cpp's 400s, Anthropic's compatibility layer's, or a gateway's 413.

Counters (thread-safe): `requests` (chat POSTs), `preflights`, `turns` (= requests - preflights).
`errors` lists the unexpected exceptions the handler met (answered as 500s): a test can assert
it is empty.
"""

from __future__ import annotations

import collections
import hashlib
import json
import socket
import socketserver
import threading
import time
import traceback
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Mapping

from agents import Brief, make_policy
from finality_gym.policy import PolicyError
from agents.model import PREFLIGHT
from finality_gym.episode import check_call
from finality_gym.world import DISPOSITIONS

FAULT_KINDS = ("status", "drop", "garbage", "stall", "trickle", "trickle_head", "flood")
FLOOD_CHUNK = 1 << 20
OVERFLOW_STYLES = ("openai", "vllm", "llamacpp", "anthropic", "413")
GARBAGE = b'{"choices": [ this is not json'
WAIT_ONLY = ("string_int", "float_int", "empty_args_for_wait", "empty_object_for_wait")
MISBEHAVIOURS = ("unknown_tool", "bad_json", "text_only", "wrong_args", "string_int", "float_int",
                 "empty_args_for_wait", "empty_object_for_wait", "trailing_call",
                 "invalid_then_call")
UNKNOWN_TOOL = "read_everything"
TEXT_ONLY = "Let me think about it."
_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True)
class Fault:
    """One injected infrastructure fault. `status`: answer `status` with an OpenAI-style error
    body and `headers` (e.g. `{"Retry-After": "0"}`); `drop`: close the connection without a
    response; `garbage`: a 200 whose body is not JSON; `stall`: sleep `seconds`, then answer
    normally (the client has usually timed out by then).

    The hostile ones, each bounded so that a test's server always stops: `trickle`: a 200's
    headers (announcing a `size`-byte JSON body), then one byte of it every `seconds`, at most
    `size` bytes, until the client goes or the server closes; `trickle_head`: the same, but the
    status line and headers themselves one byte every `seconds` (they never end); `flood`: the
    normal answer (a `status` 200) or an error body (any other `status`), with `size` bytes of
    padding in it (the assistant's content, or the error's message), streamed in 1 MiB writes
    until it is sent, the client goes or the server closes; with `headers`
    `{"Content-Encoding": "gzip"}` the body goes gzip-compressed (a few hundred KB on the wire
    for hundreds of MB decoded)."""

    kind: str
    status: int = 500
    headers: Mapping[str, str] = field(default_factory=dict)
    seconds: float = 1.0
    message: str | None = None
    size: int = 600  # trickle: bytes announced and sent at most; flood: bytes of padding

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; valid: {', '.join(FAULT_KINDS)}")
        if not 100 <= self.status <= 599:
            raise ValueError(f"status must be an HTTP status, got {self.status}")
        if self.size < 0:
            raise ValueError(f"size must be >= 0, got {self.size}")


def fault_schedule(faults: Mapping[int, Fault]) -> Callable[[int, dict], Fault | None]:
    """A `faults` hook from {request number: Fault}."""
    faults = dict(faults)
    return lambda n, body: faults.get(n)


def misbehave_schedule(kinds: Mapping[int, str]) -> Callable[[int, tuple], str | None]:
    """A `misbehave` hook from {turn: kind}."""
    for kind in kinds.values():
        if kind not in MISBEHAVIOURS:
            raise ValueError(f"unknown misbehaviour {kind!r}; valid: {', '.join(MISBEHAVIOURS)}")
    kinds = dict(kinds)
    return lambda turn, call: kinds.get(turn)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status, message, type_, code, param)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _error_kind(status: int) -> tuple[str, str | None]:
    if status == 429:
        return "requests", "rate_limit_exceeded"
    if status >= 500:
        return "server_error", None
    return "invalid_request_error", None


class ChatServer:
    """The server; a context manager. `base_url` ends in `/v1`."""

    def __init__(self, policy: str = "finality_gate", *, api_key: str = "test-key",
                 models: tuple[str, ...] = ("scripted-model",),
                 faults: Callable[[int, dict], Fault | None] | None = None,
                 misbehave: Callable[[int, tuple], str | None] | None = None,
                 rewrite: Callable[[int, dict, dict], dict | bytes | None] | None = None,
                 context_tokens: int | None = None, overflow: str = "openai",
                 reasoning: bool = False, signatures: bool = False):
        make_policy(policy)  # an unknown spec fails here, not in the handler
        if overflow not in OVERFLOW_STYLES:
            raise ValueError(f"overflow must be one of {OVERFLOW_STYLES}, got {overflow!r}")
        self.context_tokens, self.overflow = context_tokens, overflow
        self.reasoning, self.signatures = reasoning, signatures
        self.policy = policy
        self.api_key = api_key
        self.models = tuple(models)
        self.faults = faults
        self.misbehave = misbehave
        self.rewrite = rewrite
        self.errors: list[str] = []
        self.sent: collections.Counter = collections.Counter()  # misbehaviours sent, by kind
        self._lock = threading.Lock()
        self._requests = 0
        self._preflights = 0
        self._closing = threading.Event()
        self._connections: set[socket.socket] = set()
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.chat = self
        self.port = self._httpd.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={
            "poll_interval": 0.05}, name=f"chat-server-{self.port}", daemon=True)
        self._thread.start()
        self._closed = False

    # ----------------------------------------------------------------- counters
    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests

    @property
    def preflights(self) -> int:
        with self._lock:
            return self._preflights

    @property
    def turns(self) -> int:
        with self._lock:
            return self._requests - self._preflights

    # ----------------------------------------------------------------- life cycle
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._closing.set()  # wakes stalled handlers
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # keep-alive connections the clients still hold
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)

    def __enter__(self) -> "ChatServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ChatServer({self.base_url!r}, policy={self.policy!r})"

    # ----------------------------------------------------------------- the model
    def _count(self, body: dict) -> int:
        preflight = _is_preflight(body.get("messages"))
        with self._lock:
            n = self._requests
            self._requests += 1
            self._preflights += preflight
            return n

    def _complete(self, n: int, body: dict, authorization: str | None) -> dict:
        if authorization != f"Bearer {self.api_key}":
            raise _HTTPError(401, "Incorrect API key provided", code="invalid_api_key")
        if not body:
            raise _HTTPError(400, "We could not parse the JSON body of your request.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _HTTPError(400, "you must provide a model parameter", param="model")
        if model not in self.models:
            raise _HTTPError(404, f"The model `{model}` does not exist",
                             code="model_not_found", param="model")
        if self.reasoning:
            _reasoning_terms(body)
        messages = body.get("messages")
        _validate(messages)
        if self.signatures:
            _check_signatures(messages)
        if self.context_tokens is not None:
            _fits(messages, body, self.context_tokens, self.overflow)
        if _is_preflight(messages):
            return self._reply(n, model, messages, "ready", [])
        tools = body.get("tools")
        if not tools or not isinstance(tools, list):
            raise _HTTPError(400, "this scripted model acts only through tools: the request has "
                                  "no 'tools'", param="tools")
        turn, call, policy = self._replay(messages)
        if call is None:
            return self._reply(n, model, messages, "I have nothing more to do.", [])
        kind = self.misbehave(turn, call) if self.misbehave is not None else None
        if kind == "trailing_call" and not _ends_case(policy, call):
            kind = None
        content, calls = _emit(turn, call, kind)
        if kind is not None and (kind not in WAIT_ONLY or call[0] == "wait"):
            with self._lock:
                self.sent[kind] += 1
        return self._reply(n, model, messages, content, calls)

    def _replay(self, messages: list) -> tuple[int, tuple | None, object]:
        brief = _brief(messages)
        policy = make_policy(self.policy)
        policy.reset(brief)
        try:
            call = policy.act(None)
        except PolicyError:  # the plan ended
            call = None
        turn = 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            turn += 1
            answers = {}
            for later in messages[i + 1:]:
                if later["role"] != "tool":
                    break
                answers[later["tool_call_id"]] = later.get("content")
            for tc in m.get("tool_calls") or ():
                result = _world_result(answers.get(tc["id"]))
                if result is None:
                    continue  # a harness error answer: the world never saw this call
                made = _call_of(tc)
                if call is None or made is None or not _same(made, call) or (
                        result.get("tool") != made[0]):
                    raise _HTTPError(400, "the conversation diverged from the scripted policy "
                                          f"{self.policy!r} at tool call {tc['id']!r}: expected "
                                          f"{_show(call)}, the conversation has {_show(made)} "
                                          f"with result {json.dumps(result)[:200]}")
                try:
                    call = policy.act(result)
                except PolicyError:  # the plan ended
                    call = None
                except (KeyError, TypeError, ValueError) as exc:
                    raise _HTTPError(400, "the conversation diverged from the scripted policy: "
                                          f"it could not read the result of {tc['id']!r} "
                                          f"({type(exc).__name__}: {exc})") from None
        return turn, call, policy

    def _reply(self, n: int, model: str, messages: list, content: str | None,
               calls: list) -> dict:
        message = {"role": "assistant", "content": content}
        if calls:
            if self.signatures:
                calls = [{**c, "extra_content": {"google": {"thought_signature":
                                                            _signature(c["id"])}}}
                         for c in calls]
            message["tool_calls"] = calls
        prompt = len(json.dumps(messages)) // 4
        completion = len(json.dumps(message)) // 4
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion}
        if self.reasoning:  # a fixed share of each, so that a test can compute the sums
            usage["completion_tokens_details"] = {"reasoning_tokens": REASONING_TOKENS}
            usage["prompt_tokens_details"] = {"cached_tokens": prompt // 2}
            usage["completion_tokens"] += REASONING_TOKENS
        return {"id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": message,
                             "finish_reason": "tool_calls" if calls else "stop"}],
                "usage": usage}

    def _models(self, authorization: str | None) -> dict:
        if authorization != f"Bearer {self.api_key}":
            raise _HTTPError(401, "Incorrect API key provided", code="invalid_api_key")
        return {"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "finality-gym"}
            for m in self.models]}


# --------------------------------------------------------------------- conversation helpers
REASONING_TOKENS = 7  # per reply of a reasoning model


def _reasoning_terms(body: dict) -> None:
    """An OpenAI reasoning model's refusals, in its words."""
    if "max_tokens" in body:
        raise _HTTPError(400, "Unsupported parameter: 'max_tokens' is not supported with this "
                              "model. Use 'max_completion_tokens' instead.",
                         code="unsupported_parameter", param="max_tokens")
    if body.get("temperature", 1) != 1:
        raise _HTTPError(400, f"Unsupported value: 'temperature' does not support "
                              f"{body['temperature']} with this model. Only the default (1) "
                              "value is supported.", code="unsupported_value",
                         param="temperature")


def _signature(call_id: str) -> str:
    return "sig-" + hashlib.sha256(call_id.encode()).hexdigest()[:24]


def _check_signatures(messages: list) -> None:
    """Gemini's rule: every tool call of the history comes back with its thought signature."""
    for i, m in enumerate(messages):
        for tc in m.get("tool_calls") or [] if m.get("role") == "assistant" else []:
            extra = tc.get("extra_content") if isinstance(tc, dict) else None
            got = ((extra or {}).get("google") or {}).get("thought_signature")
            if got != _signature(tc.get("id", "")):
                raise _HTTPError(400, f"Function call is missing a thought_signature in "
                                      f"functionCall parts (messages[{i}], call "
                                      f"{tc.get('id')!r}). This is required for tools to work "
                                      "correctly.", type_="INVALID_ARGUMENT")


def _fits(messages: list, body: dict, window: int, style: str) -> None:
    """Refuse a request that does not fit a `window`-token context, as `style`'s server does."""
    given = len(json.dumps(messages)) // 4
    wanted = int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)
    if given + wanted <= window:
        return
    if style == "413":
        raise _HTTPError(413, "Request Entity Too Large", type_="request_too_large")
    if style == "openai":
        raise _HTTPError(400, f"This model's maximum context length is {window} tokens. However, "
                              f"your messages resulted in {given + wanted} tokens. Please reduce "
                              "the length of the messages.", code="context_length_exceeded",
                         param="messages")
    if style == "vllm":
        raise _HTTPError(400, f"This model's maximum context length is {window} tokens. However, "
                              f"you requested {given + wanted} tokens ({given} in the messages, "
                              f"{wanted} in the completion). Please reduce the length of the "
                              "messages or completion.", type_="BadRequestError")
    if style == "llamacpp":
        raise _HTTPError(400, f"request ({given + wanted} tokens) exceeds the available context "
                              f"size ({window} tokens), try increasing it",
                         type_="exceed_context_size_error")
    raise _HTTPError(400, f"prompt is too long: {given + wanted} tokens > {window} maximum")


def _is_preflight(messages) -> bool:
    return isinstance(messages, list) and any(
        isinstance(m, dict) and m.get("role") == "user" and m.get("content") == PREFLIGHT
        for m in messages)


def _validate(messages) -> None:
    """OpenAI's rules for a conversation with tool calls."""
    if not isinstance(messages, list) or not messages:
        raise _HTTPError(400, "'messages' must be a non-empty array", param="messages")
    pending: dict[str, bool] | None = None  # the last assistant message's call ids: answered?
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise _HTTPError(400, f"Invalid value for 'messages[{i}].role': expected one of "
                                  f"{', '.join(sorted(_ROLES))}", param=f"messages[{i}].role")
        role = m["role"]
        if role == "tool":
            if pending is None:
                raise _HTTPError(400, "Invalid parameter: messages with role 'tool' must be a "
                                      "response to a preceding message with 'tool_calls'.",
                                 param=f"messages.[{i}].role")
            call_id = m.get("tool_call_id")
            if call_id not in pending:
                raise _HTTPError(400, f"Invalid parameter: 'tool_call_id' of '{call_id}' not "
                                      "found in 'tool_calls' of previous message.",
                                 param=f"messages.[{i}].tool_call_id")
            if pending[call_id]:
                raise _HTTPError(400, f"Invalid parameter: 'tool_call_id' of '{call_id}' is "
                                      "answered twice.", param=f"messages.[{i}].tool_call_id")
            pending[call_id] = True
            continue
        _check_answered(pending, i)
        pending = None
        if role == "assistant" and m.get("tool_calls"):
            pending = {}
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise _HTTPError(400, f"'messages[{i}].tool_calls' must be an array")
            for k, tc in enumerate(calls):
                function = tc.get("function") if isinstance(tc, dict) else None
                if (not isinstance(tc.get("id") if isinstance(tc, dict) else None, str)
                        or tc.get("type") != "function" or not isinstance(function, dict)
                        or not isinstance(function.get("name"), str)
                        or not isinstance(function.get("arguments"), str)):
                    raise _HTTPError(400, f"Invalid 'messages[{i}].tool_calls[{k}]': a tool call "
                                          "needs a string 'id', type 'function' and a function "
                                          "with a string 'name' and string 'arguments'")
                if tc["id"] in pending:
                    raise _HTTPError(400, f"Duplicate tool call id '{tc['id']}' in "
                                          f"'messages[{i}].tool_calls'")
                pending[tc["id"]] = False
    _check_answered(pending, len(messages))


def _check_answered(pending: dict | None, i: int) -> None:
    if pending is None:
        return
    missing = [call_id for call_id, answered in pending.items() if not answered]
    if missing:
        raise _HTTPError(400, "An assistant message with 'tool_calls' must be followed by tool "
                              "messages responding to each 'tool_call_id'. The following "
                              f"tool_call_ids did not have response messages: {', '.join(missing)}",
                         param=f"messages.[{i}]")


def _brief(messages: list) -> Brief:
    for m in messages:
        if m["role"] == "user":
            text = m.get("content")
            break
    else:
        raise _HTTPError(400, "the conversation has no user message with the case brief")
    try:
        fields, _ = json.JSONDecoder().raw_decode(text, text.index("{"))
        return Brief(order_value=fields["order_value"], handover_at=fields["now"],
                     ship_by=fields["ship_by"], horizon=fields["horizon"],
                     budget=fields["calls_left"], probe=fields["probe_arm"], seed=0)
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise _HTTPError(400, f"the first user message holds no case brief ({exc})") from None


def _world_result(content) -> dict | None:
    try:
        result = json.loads(content)
    except (TypeError, ValueError):
        return None
    return result if isinstance(result, dict) and "t" in result else None


def _call_of(tc: dict) -> tuple[str, dict] | None:
    raw = tc["function"]["arguments"]
    try:
        args = json.loads(raw) if raw not in ("", "null") else {}
    except ValueError:
        return None
    return (tc["function"]["name"], args) if isinstance(args, dict) else None


def _same(made: tuple, call: tuple) -> bool:
    # canonical JSON, so that 60.0 is not 60 and True is not 1
    return made[0] == call[0] and (json.dumps(made[1], sort_keys=True)
                                   == json.dumps(call[1], sort_keys=True))


def _show(call) -> str:
    return "nothing (the policy has ended)" if call is None else f"{call[0]}({json.dumps(call[1])})"


def _ends_case(policy, call: tuple[str, dict]) -> bool:
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


def _emit(turn: int, call: tuple[str, dict], kind: str | None) -> tuple[str | None, list]:
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


def _flood_parts(head: bytes, size: int, tail: bytes, gzip: bool):
    """`head`, `size` bytes of padding, `tail`, in 1 MiB pieces, made as they are sent (a
    flood of hundreds of MB never sits in the server's memory); gzip-compressed if asked."""
    def plain():
        yield head
        left = size
        chunk = b"a" * FLOOD_CHUNK
        while left > 0:
            yield chunk[:left]
            left -= len(chunk)
        yield tail

    if not gzip:
        yield from plain()
        return
    import zlib
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    for part in plain():
        packed = packer.compress(part)
        if packed:
            yield packed
    yield packer.flush()


# --------------------------------------------------------------------- HTTP
class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    chat: ChatServer

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN (a DNS lookup); not needed here
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away (a timeout, a drop) is not an error of the server


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scripted-chat/1.0"
    sys_version = ""
    disable_nagle_algorithm = True
    wbufsize = -1  # headers and body leave in one write; handle_one_request flushes

    def setup(self) -> None:
        super().setup()
        chat = self.server.chat
        with chat._lock:
            chat._connections.add(self.connection)

    def finish(self) -> None:
        chat = self.server.chat
        with chat._lock:
            chat._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format, *args) -> None:
        pass

    def _path(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send(self, status: int, payload: bytes, headers: Mapping[str, str] = {},
              content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, str(value))
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, data: dict, headers: Mapping[str, str] = {}) -> None:
        self._send(status, json.dumps(data).encode(), headers)

    def do_GET(self) -> None:
        self._read_body()
        if self._path() != "/v1/models":
            self._not_found()
            return
        try:
            self._send_json(200, self.server.chat._models(self.headers.get("Authorization")))
        except _HTTPError as exc:
            self._send_json(exc.status, exc.body())

    def do_POST(self) -> None:
        raw = self._read_body()
        if self._path() != "/v1/chat/completions":
            self._not_found()
            return
        chat: ChatServer = self.server.chat
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                body = {}
        except ValueError:
            body = {}
        n = chat._count(body)
        fault = chat.faults(n, body) if chat.faults is not None else None
        if fault is not None:
            if fault.kind == "drop":
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return
            if fault.kind == "garbage":
                self._send(200, GARBAGE)
                return
            if fault.kind == "status":
                type_, code = _error_kind(fault.status)
                message = fault.message or f"injected fault: HTTP {fault.status}"
                self._send_json(fault.status, _HTTPError(fault.status, message, type_, code).body(),
                                fault.headers)
                return
            if fault.kind in ("trickle", "trickle_head"):
                self._trickle(fault)
                return
            if fault.kind == "flood":
                self._flood(chat, n, body, fault)
                return
            chat._closing.wait(fault.seconds)  # stall, then answer normally
        try:
            data = chat._complete(n, body, self.headers.get("Authorization"))
        except _HTTPError as exc:
            self._send_json(exc.status, exc.body())
        except Exception as exc:  # a bug here or in a hook: say so rather than hang the client
            text = "".join(traceback.format_exception(exc))
            with chat._lock:
                chat.errors.append(text)
            self._send_json(500, _HTTPError(500, f"scripted model failed: {exc!r}",
                                            "server_error").body())
        else:
            if chat.rewrite is not None:
                try:
                    replaced = chat.rewrite(n, body, data)
                except Exception as exc:  # a bug in the hook: say so, as above
                    with chat._lock:
                        chat.errors.append("".join(traceback.format_exception(exc)))
                    self._send_json(500, _HTTPError(500, f"rewrite failed: {exc!r}",
                                                    "server_error").body())
                    return
                if isinstance(replaced, bytes):
                    self._send(200, replaced)
                    return
                if replaced is not None:
                    data = replaced
            self._send_json(200, data)

    def _trickle(self, fault: Fault) -> None:
        """Headers (or, for `trickle_head`, not even all of them), then a byte every
        `fault.seconds`: at most `fault.size` bytes, until the client goes or the server
        closes."""
        self.close_connection = True
        chat: ChatServer = self.server.chat
        if fault.kind == "trickle":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(fault.size))
            self.end_headers()
            drip = b" " * fault.size  # JSON's leading whitespace: a valid prefix of a body
        else:
            drip = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: "
                    + b"a" * fault.size)[:fault.size]
        try:
            self.wfile.flush()
            for i in range(len(drip)):
                self.wfile.write(drip[i:i + 1])
                self.wfile.flush()
                if chat._closing.wait(fault.seconds):
                    return
        except OSError:  # the client went away: what it should do
            return

    def _flood(self, chat: "ChatServer", n: int, body: dict, fault: Fault) -> None:
        """The answer with `fault.size` bytes of padding in it, streamed."""
        self.close_connection = True
        marker = "\u0000PADDING\u0000"
        if fault.status == 200:
            try:
                data = chat._complete(n, body, self.headers.get("Authorization"))
            except _HTTPError as exc:
                self._send_json(exc.status, exc.body())
                return
            data["choices"][0]["message"]["content"] = marker
        else:
            type_, code = _error_kind(fault.status)
            data = _HTTPError(fault.status, marker, type_, code).body()
        head, tail = json.dumps(data).encode().split(json.dumps(marker).encode())
        gzip = dict(fault.headers).get("Content-Encoding") == "gzip"
        parts = _flood_parts(head + b'"', fault.size, b'"' + tail, gzip)
        self.send_response(fault.status)
        self.send_header("Content-Type", "application/json")
        for name, value in fault.headers.items():
            self.send_header(name, str(value))
        if gzip:  # no Content-Length: the body ends when the connection does
            self.send_header("Connection", "close")
        else:
            self.send_header("Content-Length", str(len(head) + fault.size + len(tail) + 2))
        self.end_headers()
        try:
            for part in parts:
                if chat._closing.is_set():
                    return
                self.wfile.write(part)
            self.wfile.flush()
        except OSError:  # the client stopped reading and closed: what it should do
            return

    def _not_found(self) -> None:
        self._send_json(404, _HTTPError(404, f"Invalid URL ({self.command} {self.path})").body())
