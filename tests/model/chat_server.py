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
reply. A hostile endpoint's replies, for `tests/model/test_model_replies.py`.

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

This module is the server and its hooks; the scripted model's rules and words (what a
conversation must be, the misbehaviours, the providers' ways) are `tests/model/chat_script.py`'s,
and the HTTP handler that delivers replies and faults is `tests/model/chat_http.py`'s.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from agents import make_policy
from finality_gym.policy import PolicyError

from tests.model.chat_http import ChatHandler, ChatHTTPServer
from tests.model.chat_script import (MISBEHAVIOURS, OVERFLOW_STYLES, REASONING_TOKENS, WAIT_ONLY,
                                     HTTPError, brief_of, call_of, check_signatures, emit,
                                     ends_case, fits, is_preflight, misbehave_schedule,
                                     reasoning_terms, same, show, signature, validate,
                                     world_result)

__all__ = ["ChatServer", "Fault", "FAULT_KINDS", "MISBEHAVIOURS", "OVERFLOW_STYLES", "WAIT_ONLY",
           "fault_schedule", "misbehave_schedule"]

FAULT_KINDS = ("status", "drop", "garbage", "stall", "trickle", "trickle_head", "flood")


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
        self._httpd = ChatHTTPServer(("127.0.0.1", 0), ChatHandler)
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
        preflight = is_preflight(body.get("messages"))
        with self._lock:
            n = self._requests
            self._requests += 1
            self._preflights += preflight
            return n

    def _complete(self, n: int, body: dict, authorization: str | None) -> dict:
        if authorization != f"Bearer {self.api_key}":
            raise HTTPError(401, "Incorrect API key provided", code="invalid_api_key")
        if not body:
            raise HTTPError(400, "We could not parse the JSON body of your request.")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise HTTPError(400, "you must provide a model parameter", param="model")
        if model not in self.models:
            raise HTTPError(404, f"The model `{model}` does not exist",
                             code="model_not_found", param="model")
        if self.reasoning:
            reasoning_terms(body)
        messages = body.get("messages")
        validate(messages)
        if self.signatures:
            check_signatures(messages)
        if self.context_tokens is not None:
            fits(messages, body, self.context_tokens, self.overflow)
        if is_preflight(messages):
            return self._reply(n, model, messages, "ready", [])
        tools = body.get("tools")
        if not tools or not isinstance(tools, list):
            raise HTTPError(400, "this scripted model acts only through tools: the request has "
                                  "no 'tools'", param="tools")
        turn, call, policy = self._replay(messages)
        if call is None:
            return self._reply(n, model, messages, "I have nothing more to do.", [])
        kind = self.misbehave(turn, call) if self.misbehave is not None else None
        if kind == "trailing_call" and not ends_case(policy, call):
            kind = None
        content, calls = emit(turn, call, kind)
        if kind is not None and (kind not in WAIT_ONLY or call[0] == "wait"):
            with self._lock:
                self.sent[kind] += 1
        return self._reply(n, model, messages, content, calls)

    def _replay(self, messages: list) -> tuple[int, tuple | None, object]:
        brief = brief_of(messages)
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
                result = world_result(answers.get(tc["id"]))
                if result is None:
                    continue  # a harness error answer: the world never saw this call
                made = call_of(tc)
                if call is None or made is None or not same(made, call) or (
                        result.get("tool") != made[0]):
                    raise HTTPError(400, "the conversation diverged from the scripted policy "
                                          f"{self.policy!r} at tool call {tc['id']!r}: expected "
                                          f"{show(call)}, the conversation has {show(made)} "
                                          f"with result {json.dumps(result)[:200]}")
                try:
                    call = policy.act(result)
                except PolicyError:  # the plan ended
                    call = None
                except (KeyError, TypeError, ValueError) as exc:
                    raise HTTPError(400, "the conversation diverged from the scripted policy: "
                                          f"it could not read the result of {tc['id']!r} "
                                          f"({type(exc).__name__}: {exc})") from None
        return turn, call, policy

    def _reply(self, n: int, model: str, messages: list, content: str | None,
               calls: list) -> dict:
        message = {"role": "assistant", "content": content}
        if calls:
            if self.signatures:
                calls = [{**c, "extra_content": {"google": {"thought_signature":
                                                            signature(c["id"])}}}
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
            raise HTTPError(401, "Incorrect API key provided", code="invalid_api_key")
        return {"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "finality-gym"}
            for m in self.models]}
