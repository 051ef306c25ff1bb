"""The model's endpoint: what the policy asks of one (`ChatEndpoint`), and the Chat Completions
endpoint over HTTP that answers it (`Endpoint`).

Infrastructure is not the agent: timeouts, dropped connections, 408/409/429/5xx and unreadable
bodies are retried with exponential backoff and jitter, honouring `Retry-After`; when the
retries run out the episode raises `InfrastructureError` and gets no graded row. Any other
error status (a bad key, an unknown model, a request the server will not take) is a
`ConfigurationError`. The official `openai` client (the `model` extra) sends the requests with
its own retries off, so this module owns and records every attempt; it posts the request as
plain JSON and parses the body itself (`read_body`), so a server's odd response shapes are
recorded as they came. Each attempt is cut at its deadline and its byte cap (`guard`).
"""

from __future__ import annotations

import email.utils
import random
import re
import time
from typing import Protocol

from finality_gym.tools import chat_tools

from .config import ModelConfig
from .errors import (ConfigurationError, ContextOverflow, InfrastructureError, UnreadableReply,
                     context_overflow)
from .guard import Cut, guard, limited, refuse_compressed
from .prompt import PREFLIGHT, system_prompt
from .replies import read_body

TRANSIENT_STATUS = frozenset({408, 409, 429})
# The documented replacement of a sampling field an endpoint refuses (OpenAI's reasoning models
# take `max_completion_tokens`, never `max_tokens`).
REPLACEMENTS = {"max_tokens": "max_completion_tokens"}


class ChatEndpoint(Protocol):
    """What `ModelPolicy` asks of an endpoint, and all it asks: the one interface of this
    module's `Endpoint` (Chat Completions over HTTP) and of inspect's
    (`eval.models.inspect_task.InspectEndpoint`, whose model inspect asks). Whatever answers,
    the conversation, its caps and its checks are the policy's."""

    params: dict
    """The sampling fields each request carries besides the harness's own (`model`,
    `messages`, `tools`, `tool_choice`): `ModelConfig.request_params` as the endpoint takes
    them (a preflight may have adapted them), or `{}` where the sampling settings are the
    endpoint's own. The policy puts them in every request and records them with every turn."""

    def complete(self, request: dict, rng: random.Random, *,
                 room: int | None = None) -> tuple[dict, float, int, list[str]]:
        """Answer one Chat Completions `request` with (body, the latency in seconds of the
        attempt that got it, the attempts made, the transient errors before it). `body` is the
        reply as the endpoint got it, never repaired: the policy checks it (`check_reply`)
        whoever answered. `rng` is the episode's own generator (for a retry's jitter), so a run
        is reproducible. `room`, when given, is what the episode's transcript has left, in
        bytes: an endpoint that reads its reply off a wire stops reading there (an endpoint
        failure, retried); one that is handed its reply whole may ignore it (the transcript
        refuses a line past its cap itself). Raises `ContextOverflow` when the conversation no
        longer fits the model's context (the case lapses, the run goes on),
        `ConfigurationError` for a request the endpoint will never take (the run stops), and
        `InfrastructureError` when no reply came (the episode gets no row)."""
        ...


class Endpoint(ChatEndpoint):
    """The Chat Completions endpoint through the official client, its own retries off; this
    class owns the retries and returns the parsed body with what it took to get it."""

    def __init__(self, config: ModelConfig):
        self.params = config.request_params()  # what requests carry; preflight may adapt it
        self.learned: list[str] = []           # what the preflight adapted, and why
        try:
            import openai
        except ImportError as exc:
            raise ImportError("the model arm needs the 'model' extra: "
                              "pip install -e .[model]") from exc
        self.openai = openai
        self.config = config
        http_client = openai.DefaultHttpxClient(timeout=config.timeout_s,
                                                event_hooks={"response": [refuse_compressed]})
        guard(http_client)
        self.client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key(),
                                    max_retries=0, timeout=config.timeout_s,
                                    http_client=http_client,
                                    default_headers={"Accept-Encoding": "identity"})

    def complete(self, request: dict, rng: random.Random, *, retries: int | None = None,
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
            try:
                with limited(self.config.timeout_s, cap, over):
                    # The client's generic POST: `chat.completions.create` first walks the whole
                    # request through its typed-dict transforms, 4 ms a request here, more than
                    # the rest of the harness together. The body is read as text and parsed here.
                    text = self.client.post("/chat/completions", body=request, cast_to=str)
                latency = time.perf_counter() - started
                try:
                    body = read_body(text)
                except UnreadableReply as exc:
                    raise UnreadableReply(f"unreadable body ({exc}): {text[:200]}") from None
                return body, latency, attempt + 1, errors
            except UnreadableReply as exc:
                errors.append(str(exc))
            except Cut as exc:  # the attempt's deadline or its byte cap
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
            system = system_prompt(self.config.regime)
            request = {"model": self.config.model, "tools": chat_tools(), "tool_choice": "auto",
                       **small, "messages": [{"role": "system", "content": system},
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


# What the message of an attempt cut by its limits says (`guard.Cut`, `Endpoint.complete`'s byte
# cap): a preflight that fails so gets the hint that the server misbehaves.
_CAPS = ("--timeout deadline", "--max-response-bytes", "Content-Encoding")


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


