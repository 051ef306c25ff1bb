"""A language model as a policy: a chat model behind an OpenAI-compatible Chat Completions
endpoint acts through tool calls, one case per conversation.

What the model sees: the system prompt of `prompts/system.md` (the rules the agent is told; it
names no tool to prefer), a first user message with the case brief as JSON (never the seed), the
twelve tools of `finality_gym.tools.TOOL_TABLE`, and each tool result as JSON.

The loop, for what real models do:
- A call with an unknown tool, arguments that are not a JSON object, or arguments the engine
  rejects (checked by the engine's own `check_call`, so the world never sees it) is answered to
  the model as `{"error": "invalid call: ..."}` and changes nothing in the world. Empty
  arguments (`""`, `null`) are the empty object: right for the ten tools without arguments,
  missing `ticks` or `key` for the other two. `"60"` and `60.0` are not integers.
- A reply with no tool call gets `REMINDER`.
- Several tool calls in one reply run in order until the case ends or one is invalid; every
  later call of that reply is answered as not executed, so every call id has an answer.
- Caps per episode: `max_requests` requests, `max_invalid_turns` replies that were invalid (a
  reply with no call, or with an invalid call), `max_total_tokens` tokens. Reaching one ends the
  case as a lapse (`GiveUp`), and the row's `agent_status` says which (`ok` otherwise).
- A conversation that outgrows the model's context (the endpoint's refusal in any of the forms
  of `context_overflow`) ends that case as a lapse too (`agent_status: "context_overflow"`):
  the model could not go on, the run does. Only at preflight, where the conversation is its
  shortest, is it a configuration error.

Infrastructure is not the agent: timeouts, dropped connections, 408/409/429/5xx and unreadable
bodies are retried with exponential backoff and jitter, honouring `Retry-After`; when the
retries run out the episode raises `InfrastructureError` and gets no graded row. Any other
error status (a bad key, an unknown model, a request the server will not take) is a
`ConfigurationError`. The official `openai` client (the `model` extra) sends the requests with
its own retries off, so this module owns and records every attempt; it posts the request as
plain JSON and parses the body itself, so a server's odd response shapes are recorded as they
came.

An endpoint can neither hang nor flood the run. Each attempt has a wall-clock deadline
(`timeout_s`, `--timeout`) for the whole of it, connecting, sending and reading: a server that
sends its headers and then a byte a second is cut at the deadline, not after a read that never
times out. And it may receive at most `max_response_bytes` (`--max-response-bytes`), headers
and body as they come over the wire (a compressed body is refused: only `identity` is asked
for, and a compressed size says nothing of what it inflates to). Both are enforced on the
client's connections themselves (`_GuardedBackend`: every connect, write and read of an
attempt's connection, in the attempt's thread, gets at most what is left of its deadline and
counts its bytes), so nothing keeps reading past either, no thread is left behind, and the
connection is closed. Either is an endpoint failure like a timeout: retried, then the
episode's `InfrastructureError`. The episode's transcript has its own cap
(`max_transcript_bytes`, kept by the harness: `eval.model_arm.Transcript`): a response may be
no larger than what it has left.

Every reply is checked before it is believed (`read_body`, `check_reply`), and what is wrong
with it decides whose failure it is:
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
- The model's (an invalid call, as above: answered, nothing happens, counted against
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

Every request and response goes to the episode's transcript (given by the harness: the model
arm's `eval.model_arm.Transcript` keeps it in a file), with usage, latency, attempts and the
served model's name. A re-run replays the recorded responses, turn by turn while the request is
the one recorded, before it goes live: an interrupted episode never pays for a turn twice.
"""

from __future__ import annotations

import email.utils
import hashlib
import itertools
import json
import os
import random
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from finality_gym import InvalidCall
from finality_gym.economics import DEFAULT_COSTS
from finality_gym.episode import TOOLS, check_call
from finality_gym.tools import chat_tools

from finality_gym.policy import Brief, GiveUp, Policy

PROMPT_FILE = Path(__file__).with_name("prompts") / "system.md"
REMINDER = "No tool was called. Act by calling one of the tools."
PREFLIGHT = "Preflight check before the cases start: reply with anything."
TRANSIENT_STATUS = frozenset({408, 409, 429})
DEFAULT_MAX_RESPONSE_BYTES = 8 << 20     # 8 MiB a response: some 2,000 1,024-token answers
DEFAULT_MAX_TRANSCRIPT_BYTES = 64 << 20  # 64 MiB an episode's transcript (tests': <= 17 KB)
MAX_USAGE = 10 ** 9              # the most tokens any one count of a reply's usage may say
MAX_BODY_DEPTH = 64              # arrays and objects in a response body (a reply needs 8)
MAX_ARGUMENT_DEPTH = 32          # arrays and objects in a tool call's arguments (ours need 1)
MAX_ARGUMENT_BYTES = 64 << 10    # a tool call's arguments as UTF-8 (ours need some 20 bytes)
MAX_TOOL_NAME = 64               # characters of an unknown tool's name quoted back (OpenAI's cap)


def system_prompt() -> str:
    """The system prompt with the world's constants filled in (the file holds placeholders)."""
    from finality_gym.tasks import CALL_BUDGET, HANDOVER_AT, HORIZON, SHIP_BY
    return PROMPT_FILE.read_text().format(
        handover_at=HANDOVER_AT, budget=CALL_BUDGET, horizon=HORIZON, ship_by=SHIP_BY,
        cogs_percent=round(DEFAULT_COSTS.cogs_fraction * 100),
        dispute_fee=DEFAULT_COSTS.dispute_fee, escalation_fee=DEFAULT_COSTS.escalation_fee)


def prompt_hash() -> str:
    return hashlib.sha256(system_prompt().encode()).hexdigest()[:16]


def brief_message(brief: Brief) -> str:
    """The first user message: the brief as JSON, without the seed."""
    fields = {"order_value": brief.order_value, "now": brief.handover_at,
              "ship_by": brief.ship_by, "horizon": brief.horizon, "calls_left": brief.budget,
              "probe_arm": brief.probe}
    return ("A new case has been handed to you. Money is in cents, times in ticks.\n"
            + json.dumps(fields))


def result_content(result: dict) -> str:
    return json.dumps(result, separators=(",", ":"))


class InfrastructureError(RuntimeError):
    """The endpoint failed past every retry: the episode is not graded, and a re-run redoes it."""


class ConfigurationError(RuntimeError):
    """The endpoint refused the request for a reason retrying cannot fix; stops the run.
    `status` and `error` (the response's error object, or its text) when an endpoint said so."""

    def __init__(self, text: str, status: int | None = None, error: dict | str | None = None):
        super().__init__(text)
        self.status, self.error = status, error


class BudgetSpent(InfrastructureError):
    """The run has spent its `max_cost`: the episode is not started (no row; a re-run with a
    larger budget completes the run)."""


class Budget:
    """What a run may spend on requests (`max_cost`), in integer micro-dollars, shared by its
    threads: `spent` starts at what the folder's graded rows cost."""

    def __init__(self, limit_usd: float, spent: int = 0):
        self.limit = round(limit_usd * 1_000_000)
        self.spent = spent
        self._lock = threading.Lock()

    def add(self, cost: int) -> None:
        with self._lock:
            self.spent += cost

    def check(self) -> None:
        with self._lock:
            if self.spent >= self.limit:
                raise BudgetSpent(f"the run has spent ${self.spent / 1e6:.4f} of its --max-cost "
                                  f"${self.limit / 1e6:.4f}: no new episode starts")


class ContextOverflow(ConfigurationError):
    """The conversation no longer fits the model's context: a lapse mid-episode."""


# How servers say a request does not fit the context: OpenAI (`context_length_exceeded`,
# "This model's maximum context length is 4096 tokens. However, your messages resulted in ..."),
# vLLM ("This model's maximum context length is ..."; newer: "... your request has N input
# tokens"), llama.cpp's server (`exceed_context_size_error`, "the request exceeds the available
# context size"), Anthropic's compatibility layer ("prompt is too long: N tokens > M maximum"),
# Gemini's ("The input token count (N) exceeds the maximum number of tokens allowed (M)"); and a
# gateway's 413 (the body itself too large).
_OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error",
                             "string_above_max_length"})
_OVERFLOW_TEXT = re.compile(r"maximum context length|context (size|window|length)|prompt is too "
                            r"long|input token count .* exceeds|too many (input )?tokens",
                            re.IGNORECASE)


def context_overflow(status: int, error: dict | str) -> bool:
    """Whether an error response says the conversation does not fit the model's context."""
    if status == 413:
        return True
    if status != 400:
        return False
    if isinstance(error, dict):
        if {str(error.get("code")), str(error.get("type"))} & _OVERFLOW_CODES:
            return True
        error = str(error.get("message", ""))
    return bool(_OVERFLOW_TEXT.search(error))


@dataclass(frozen=True)
class ModelConfig:
    """What a model run is. The fields that decide a row (the model, its sampling settings and
    caps) are pinned in the run's manifest by the model arm (`eval/model_arm.py`); the endpoint,
    the key's variable and the retry schedule are not."""

    model: str
    base_url: str
    api_key_env: str | None = None
    temperature: float = 0.0
    max_tokens: int = 1024          # per response
    max_total_tokens: int | None = None  # per episode, prompt and completion tokens together
    max_requests: int = 80
    max_invalid_turns: int = 8
    timeout_s: float = 120.0        # a deadline for each attempt as a whole, not for a read
    max_retries: int = 6
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES      # per attempt, over the wire
    max_transcript_bytes: int = DEFAULT_MAX_TRANSCRIPT_BYTES  # per episode's transcript file
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0
    params: tuple[tuple[str, str], ...] = ()  # --param KEY=JSON: more request fields (JSON text)
    no_params: tuple[str, ...] = ()           # --no-param KEY: a field never sent
    price_in: float | None = None   # dollars per million prompt tokens
    price_out: float | None = None  # dollars per million completion tokens (reasoning included)
    max_cost: float | None = None   # dollars: no episode starts once the run has spent this

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: name the model to call")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must lie in [0, 2], got {self.temperature}")
        for name in ("max_tokens", "max_requests", "max_invalid_turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_total_tokens is not None and self.max_total_tokens < 1:
            raise ValueError(f"max_total_tokens must be >= 1, got {self.max_total_tokens}")
        if self.max_retries < 0 or self.timeout_s <= 0 or self.backoff_s < 0:
            raise ValueError("max_retries >= 0, timeout_s > 0 and backoff_s >= 0 are required")
        for name in ("max_response_bytes", "max_transcript_bytes"):
            if getattr(self, name) < 1024:
                raise ValueError(f"{name} must be >= 1024, got {getattr(self, name)}")
        for name in ("price_in", "price_out"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.max_cost is not None and (self.max_cost <= 0 or None in (self.price_in,
                                                                          self.price_out)):
            raise ValueError("--max-cost needs a positive amount and both --price-in and "
                             "--price-out (the cost of a request is counted from its tokens)")
        keys = [key for key, _ in self.params]
        for key in keys + list(self.no_params):
            if key in OWN_FIELDS:
                raise ValueError(f"--param/--no-param {key}: the harness sets {key} itself")
        if len(set(keys)) != len(keys) or set(keys) & set(self.no_params):
            raise ValueError(f"--param/--no-param: each field once ({keys}, "
                             f"{list(self.no_params)})")
        for key, text in self.params:
            try:
                json.loads(text)
            except ValueError:
                raise ValueError(f"--param {key}={text}: the value is not JSON (a string is "
                                 f"quoted: {key}='\"{text}\"')") from None

    def cost(self, usage: dict) -> int:
        """What a request cost, in integer micro-dollars (money is integers here; a request
        costs far less than a cent): its prompt and completion tokens at the prices given,
        0 without them. Cached prompt tokens are priced as the others."""
        if self.price_in is None or self.price_out is None:
            return 0
        return round(usage["prompt_tokens"] * self.price_in
                     + usage["completion_tokens"] * self.price_out)

    def request_params(self) -> dict:
        """The sampling fields a request carries, before the endpoint says what it takes:
        temperature and max_tokens, then every --param, less every --no-param."""
        sent = {"temperature": self.temperature, "max_tokens": self.max_tokens,
                **{key: json.loads(text) for key, text in self.params}}
        for key in self.no_params:
            sent.pop(key, None)
        return sent

    def api_key(self) -> str:
        if self.api_key_env is None:
            return "none"  # local servers (Ollama, vLLM, llama.cpp) take any key
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigurationError(f"the environment variable {self.api_key_env} (--api-key-env)"
                                     " is not set or empty")
        return key


class Endpoint:
    """The Chat Completions endpoint through the official client, its own retries off; this
    class owns the retries and returns the parsed body with what it took to get it."""

    def __init__(self, config: ModelConfig):
        self.params = config.request_params()  # what requests carry; preflight may adapt it
        self.learned: list[str] = []           # what the preflight adapted, and why
        try:
            import openai
        except ImportError as exc:
            raise ImportError("the model arm needs the 'model' extra: pip install -e .[model]") from exc
        self.openai = openai
        self.config = config
        http_client = openai.DefaultHttpxClient(timeout=config.timeout_s,
                                                event_hooks={"response": [_uncompressed]})
        _guard(http_client)
        self.client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key(),
                                    max_retries=0, timeout=config.timeout_s,
                                    http_client=http_client,
                                    default_headers={"Accept-Encoding": "identity"})

    def complete(self, request: dict, rng: random.Random, retries: int | None = None,
                 room: int | None = None) -> tuple[dict, float, int, list[str]]:
        """(body, latency of the successful attempt, attempts, transient errors). Each attempt
        is cut at its deadline and past `max_response_bytes`, or past `room` bytes when that is
        less (what the episode's transcript has left); a body `read_body` refuses is retried
        like a timeout."""
        retries = self.config.max_retries if retries is None else retries
        cap = self.config.max_response_bytes
        over = (f"the response passed the --max-response-bytes cap of {cap:,} bytes; reading "
                "stopped there")
        if room is not None and room < cap:
            cap = room
            over = (f"the response passed {cap:,} bytes, what the episode's transcript has left "
                    f"of its --max-transcript-bytes cap of {self.config.max_transcript_bytes:,} "
                    "bytes; reading stopped there")
        errors: list[str] = []
        for attempt in range(retries + 1):
            started = time.perf_counter()
            wait = None
            _LOCAL.attempt = _Attempt(self.config.timeout_s, cap, over)
            try:
                # The client's generic POST: `chat.completions.create` first walks the whole
                # request through its typed-dict transforms, 4 ms a request here, more than the
                # rest of the harness together. The body is read as text and parsed here.
                text = self.client.post("/chat/completions", body=request, cast_to=str)
                latency = time.perf_counter() - started
                try:
                    body = read_body(text)
                except UnreadableReply as exc:
                    raise UnreadableReply(f"unreadable body ({exc}): {text[:200]}") from None
                return body, latency, attempt + 1, errors
            except UnreadableReply as exc:
                errors.append(str(exc))
            except _Cut as exc:  # the attempt's deadline or its byte cap
                errors.append(str(exc))
            except self.openai.APITimeoutError:
                errors.append(f"timeout after {self.config.timeout_s:g} s")
            except self.openai.APIConnectionError as exc:
                errors.append(f"connection error: {exc.__cause__ or exc}")
            except self.openai.APIStatusError as exc:
                status = exc.status_code
                if context_overflow(status, _error(exc)):
                    raise ContextOverflow(_explain(status, exc), status, _error(exc)) from None
                if status not in TRANSIENT_STATUS and status < 500:
                    raise ConfigurationError(_explain(status, exc), status,
                                             _error(exc)) from None
                errors.append(f"HTTP {status}: {_message(exc)}")
                wait = _retry_after(exc.response.headers)
            finally:
                _LOCAL.attempt = None
            if attempt == retries:
                break
            if wait is None:
                wait = min(self.config.backoff_max_s, self.config.backoff_s * 2 ** attempt)
                wait *= rng.uniform(0.5, 1.0)
            time.sleep(wait)
        raise InfrastructureError(f"{len(errors)} attempts failed; last: {errors[-1]}")

    def preflight(self) -> str:
        """One small request before a run, with the run's sampling fields: a bad key, an
        unknown model, a server that takes no tools, or no server at all (after 3 attempts, not
        the run's whole retry schedule) stops the run here. A 400 that names a sampling field
        the request carried (its `param`, or a quoted name in its message: a reasoning model's
        refusal of `max_tokens` or of a temperature but 1) is learned instead: the field is
        sent under its documented replacement (`REPLACEMENTS`) or not at all, `learned` says
        so, and the preflight asks again. Returns the served model's name."""
        for _ in range(len(self.params) + 1):
            small = {key: 8 if key in ("max_tokens", "max_completion_tokens") else value
                     for key, value in self.params.items()}
            request = {"model": self.config.model, "tools": chat_tools(), "tool_choice": "auto",
                       **small, "messages": [{"role": "system", "content": system_prompt()},
                                             {"role": "user", "content": PREFLIGHT}]}
            try:
                body, *_ = self.complete(request, random.Random(0), retries=min(
                    2, self.config.max_retries))
            except InfrastructureError as exc:
                if any(cap in str(exc) for cap in _CAPS):
                    hint = ("a server this slow or this verbose is misbehaving (or needs a "
                            "larger --timeout or --max-response-bytes)")
                elif "unreadable body" in str(exc):
                    hint = ("its replies are not Chat Completions replies the harness can "
                            "read (what was wrong is said above)")
                else:
                    hint = "is the server running, and is --base-url right?"
                raise ConfigurationError(f"{self.config.base_url} does not answer ({exc}); "
                                         + hint) from None
            except ContextOverflow:
                raise
            except ConfigurationError as exc:
                if not self._learn(exc):
                    raise
                continue
            return str(body.get("model") or self.config.model)
        raise ConfigurationError(f"the endpoint refused every sampling field: {self.learned}")

    def _learn(self, exc: ConfigurationError) -> bool:
        """Adapt `params` to a 400 that names one of them; whether it did."""
        name = refused_field(exc.error, self.params) if exc.status == 400 else None
        if name is None:
            return False
        detail = _first_line(exc.error)
        replacement = REPLACEMENTS.get(name)
        if replacement is not None and replacement not in self.params:
            self.params[replacement] = self.params.pop(name)
            self.learned.append(f"{name} sent as {replacement} (refused: {detail})")
        else:
            del self.params[name]
            self.learned.append(f"{name} not sent (refused: {detail})")
        return True


_CAPS = ("--timeout deadline", "--max-response-bytes", "Content-Encoding")


class _Cut(Exception):
    """An attempt stopped by its own limits (its deadline, its byte cap): an endpoint failure,
    retried like a timeout. Raised inside the client's connection, it passes through httpx and
    the openai client as it is (neither maps an exception it does not know)."""


class _Attempt:
    """One attempt's limits: a wall-clock deadline for all of it, and the bytes it may
    receive."""

    def __init__(self, seconds: float, max_bytes: int, over: str):
        self.seconds, self.max_bytes, self.over = seconds, max_bytes, over
        self.deadline = time.monotonic() + seconds
        self.received = 0

    def late(self) -> _Cut:
        return _Cut(f"no complete response within the --timeout deadline of {self.seconds:g} s "
                    "(a deadline for the whole attempt, not for each read)")

    def run(self, operation, timeout: float | None):
        """`operation(timeout)`, its timeout no more than what is left of the deadline; a
        failure at or past the deadline is the deadline's."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.late()
        try:
            return operation(left if timeout is None else min(timeout, left))
        except Exception:
            if time.monotonic() >= self.deadline - 0.01:
                raise self.late() from None
            raise

    def count(self, n: int) -> None:
        self.received += n
        if self.received > self.max_bytes:
            raise _Cut(self.over)


_LOCAL = threading.local()  # `attempt`: the attempt this thread is making, if any


def _guarded(operation, timeout: float | None):
    attempt = getattr(_LOCAL, "attempt", None)
    return operation(timeout) if attempt is None else attempt.run(operation, timeout)


class _GuardedStream:
    """A connection of the client: each read, write and TLS handshake within the current
    attempt's deadline, each byte read counted against its cap. Writes go in pieces, so that a
    server that reads slowly meets the deadline too."""

    PIECE = 1 << 16

    def __init__(self, inner):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        attempt = getattr(_LOCAL, "attempt", None)
        if attempt is None:
            return self._inner.read(max_bytes, timeout)
        data = attempt.run(lambda t: self._inner.read(max_bytes, t), timeout)
        attempt.count(len(data))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        for start in range(0, len(view), self.PIECE):
            piece = view[start:start + self.PIECE]
            _guarded(lambda t: self._inner.write(piece, t), timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _GuardedStream(_guarded(
            lambda t: self._inner.start_tls(ssl_context, server_hostname, t), timeout))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _GuardedBackend:
    """The client's network backend, its connections guarded (`_GuardedStream`)."""

    def __init__(self, inner):
        self._inner = inner

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _GuardedStream(_guarded(lambda t: self._inner.connect_tcp(
            host, port, timeout=t, local_address=local_address, socket_options=socket_options),
            timeout))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _GuardedStream(_guarded(lambda t: self._inner.connect_unix_socket(
            path, timeout=t, socket_options=socket_options), timeout))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _guard(http_client) -> None:
    """Put `_GuardedBackend` under every connection pool of the openai client's HTTP client
    (its own, and one per proxy the environment names). httpx lets a pool be given its network
    backend but gives the client's pools no such option, so this sets the pools' attribute;
    a client that does not have one is refused here rather than run without a deadline."""
    transports = [getattr(http_client, "_transport", None),
                  *getattr(http_client, "_mounts", {}).values()]
    for transport in transports:
        if transport is None:  # a pattern that goes without a proxy: the client's own
            continue
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is None:
            raise ImportError(f"this version of the openai client's HTTP library "
                              f"({type(transport).__module__}) keeps its connections where the "
                              "model arm cannot put a deadline on them; install the pinned "
                              "versions (constraints.txt)")
        if not isinstance(backend, _GuardedBackend):
            pool._network_backend = _GuardedBackend(backend)


def _uncompressed(response) -> None:
    """A response hook: a compressed body is refused (its size on the wire, which the cap
    counts, says nothing of what it inflates to; the request asked for `identity`)."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise _Cut(f"a compressed body (Content-Encoding {encoding}) though the request asked "
                   "for identity: its size cannot be capped before it is inflated")


# Request fields the harness sets itself: --param and --no-param may not name them.
OWN_FIELDS = frozenset({"model", "messages", "tools", "tool_choice", "stream", "n"})
# The documented replacement of a sampling field an endpoint refuses (OpenAI's reasoning models
# take `max_completion_tokens`, never `max_tokens`).
REPLACEMENTS = {"max_tokens": "max_completion_tokens"}


def refused_field(error: dict | str | None, sent: dict) -> str | None:
    """The sampling field of `sent` an error names: its `param`, else the first quoted name
    in its message that is one (\"Unsupported parameter: 'max_tokens' ...\")."""
    param = error.get("param") if isinstance(error, dict) else None
    text = str(error.get("message", "") if isinstance(error, dict) else error or "")
    for name in [param, *re.findall(r"['\"`](\w+)['\"`]", text)]:
        if name in sent:
            return name
    return None


def _first_line(error) -> str:
    text = str(error.get("message", error) if isinstance(error, dict) else error)
    return text.splitlines()[0][:160] if text else "no message"


class UnreadableReply(Exception):
    """A reply that is not a Chat Completions reply the harness can believe (`check_reply`
    says what is wrong): the endpoint's failure, retried like a timeout."""


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in JSON `text`, found without parsing it: one linear
    scan that drops its strings, then counts its brackets (`json.loads` recurses once a
    level: 200,000 levels raise `RecursionError`, or worse under a raised recursion limit).
    For text that is not JSON, the count is at least as deep as a parser would go before it
    fails. An unterminated string runs to the end, and a string's pattern never backtracks
    (what stops it is a quote, the end, or a backslash at the end), so the scan stays linear
    whatever the text."""
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


def _error(exc) -> dict | str:
    """An error response's `error` object (or its text, for a server that sends no JSON)."""
    try:
        error = exc.response.json()
        return error.get("error", error) if isinstance(error, dict) else str(error)
    except Exception:
        return exc.response.text


def _message(exc) -> str:
    error = _error(exc)
    return str(error.get("message", error) if isinstance(error, dict) else error)[:300]


def _explain(status: int, exc) -> str:
    detail = _message(exc)
    fix = {401: "check the API key (--api-key-env names the variable that holds it)",
           403: "the key is not allowed to use this model",
           404: "check --model (the server does not know it) and --base-url (it should end in /v1)"
           }.get(status)
    low = detail.lower()
    if fix is None and "tool" in low:
        fix = ("the server or model does not take tool calls (vLLM: --enable-auto-tool-choice "
               "--tool-call-parser ...; Ollama: pick a model with tool support)")
    if fix is None and ("context" in low or "too long" in low or "maximum" in low):
        fix = "the conversation does not fit the model's context: serve it with a longer context"
    return f"the endpoint refused the request (HTTP {status}: {detail}); " + (
        fix or "fix the model or endpoint configuration")


def _retry_after(headers) -> float | None:
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(0.0, when.timestamp() - time.time()) if when else None


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


class ModelPolicy(Policy):
    """One model over one endpoint. `transcript`, set per episode by the harness, is anything
    with `recorded(turn, request_sha) -> line | None` (a turn to replay) and `append(line)`."""

    def __init__(self, config: ModelConfig, endpoint: Endpoint | None = None, transcript=None,
                 budget: Budget | None = None):
        self.config = config
        self.name = f"model:{config.model}"
        self.endpoint = endpoint
        self.transcript = transcript
        self.budget = budget

    def reset(self, brief: Brief) -> None:
        super().reset(brief)
        if self.budget is not None:
            self.budget.check()
        self.counts = {"requests": 0, "replayed": 0, "retries": 0, "invalid_turns": 0,
                       "tokens_in": 0, "tokens_out": 0, "tokens_reasoning": 0,
                       "tokens_cached": 0, "cost_microusd": 0}
        self.status = "ok"
        self._sent = 0  # messages already sent in an earlier request
        self._rng = random.Random(brief.seed)

    def stats(self) -> dict:
        return {**self.counts, "agent_status": self.status}

    def plan(self):
        messages = [{"role": "system", "content": system_prompt()},
                    {"role": "user", "content": brief_message(self.brief)}]
        while True:
            message = self._chat(messages)
            calls = message.get("tool_calls") or []
            messages.append(returned(message))
            if not calls:
                self._invalid_turn()
                messages.append({"role": "user", "content": REMINDER})
                continue
            stop = None
            for call in calls:
                if stop is not None:
                    answer = {"error": f"not executed: {stop}"}
                else:
                    try:
                        tool, args = _parse_call(call)
                    except InvalidCall as exc:
                        answer = {"error": f"invalid call: {exc}; nothing happened"}
                        stop = "an earlier call in this reply was invalid"
                        self._invalid_turn(raise_now=False)
                    else:
                        answer = yield (tool, args)
                messages.append({"role": "tool", "tool_call_id": call.get("id") or "",
                                 "content": result_content(answer)})
            if stop is not None:
                self._check_invalid_cap()

    def _invalid_turn(self, raise_now: bool = True) -> None:
        self.counts["invalid_turns"] += 1
        if raise_now:
            self._check_invalid_cap()

    def _check_invalid_cap(self) -> None:
        if self.counts["invalid_turns"] >= self.config.max_invalid_turns:
            self._give_up("invalid_turn_cap")

    def _give_up(self, status: str):
        self.status = status
        raise GiveUp(status)

    def _chat(self, messages: list[dict]) -> dict:
        c = self.config
        if self.counts["requests"] >= c.max_requests:
            self._give_up("request_cap")
        if c.max_total_tokens is not None and (
                self.counts["tokens_in"] + self.counts["tokens_out"] >= c.max_total_tokens):
            self._give_up("token_cap")
        params = {"model": c.model, **(self.endpoint.params if self.endpoint is not None
                                       else c.request_params())}
        request = {**params, "messages": messages, "tools": chat_tools(), "tool_choice": "auto"}
        sha = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        turn = self.counts["requests"]
        line = self.transcript.recorded(turn, sha) if self.transcript is not None else None
        if line is not None:
            try:  # written before these checks, or edited: not believed unchecked either
                usage = check_reply(line.get("response"))
            except UnreadableReply as exc:
                raise InfrastructureError(
                    f"turn {turn} of the episode's transcript holds an unreadable reply ({exc});"
                    " move the transcript away to play the episode live") from None
            self.counts["replayed"] += 1
        else:
            if self.endpoint is None:
                self.endpoint = Endpoint(c)
            room = getattr(self.transcript, "room", None)
            room = room() if room is not None else None  # bytes the transcript has left
            try:
                body, latency, attempts, errors = self.endpoint.complete(
                    request, self._rng, **({} if room is None else {"room": room}))
            except ContextOverflow:
                self._give_up("context_overflow")
            try:  # `Endpoint` checked it already; another endpoint (inspect's) may not have
                usage = check_reply(body)
            except UnreadableReply as exc:
                raise InfrastructureError(f"unreadable reply ({exc})") from None
            line = {"turn": turn, "request_sha": sha, "new_messages": messages[self._sent:],
                    "params": params, "response": body,
                    "usage": usage,
                    "latency_s": round(latency, 4), "attempts": attempts, "errors": errors,
                    "served_model": body.get("model")}
            if self.transcript is not None:
                self.transcript.append(line)
            if self.budget is not None:
                self.budget.add(c.cost(usage))
        self._sent = len(messages)
        self.counts["requests"] += 1
        self.counts["retries"] += line["attempts"] - 1
        self.counts["tokens_in"] += usage["prompt_tokens"]
        self.counts["tokens_out"] += usage["completion_tokens"]
        self.counts["tokens_reasoning"] += usage.get("reasoning_tokens", 0)
        self.counts["tokens_cached"] += usage.get("cached_tokens", 0)
        self.counts["cost_microusd"] += c.cost(usage)
        return line["response"]["choices"][0]["message"]


# Fields of an assistant message a provider documents as output only, never sent back:
# OpenAI's `annotations` (citations of its own tools), DeepSeek's `reasoning_content` (its API
# answers 400 to a request that carries it). Every other field goes back as the provider sent
# it: tool calls with their `extra_content` (Gemini's thought signatures, which it requires
# back), `reasoning_details` (OpenRouter's), `refusal`.
OUTPUT_ONLY = frozenset({"annotations", "reasoning_content"})


def returned(message: dict) -> dict:
    """The assistant message as the next request carries it: as the provider sent it, less
    `OUTPUT_ONLY` and an empty `tool_calls`."""
    back = {key: value for key, value in message.items()
            if key not in OUTPUT_ONLY and not (key == "tool_calls" and not value)}
    return {**back, "role": "assistant", "content": message.get("content")}


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


def _parse_call(call: dict) -> tuple[str, dict]:
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
