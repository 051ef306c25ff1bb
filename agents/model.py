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

Infrastructure is not the agent: timeouts, dropped connections, 408/409/429/5xx and unreadable
bodies are retried with exponential backoff and jitter, honouring `Retry-After`; when the
retries run out the episode raises `InfrastructureError` and gets no graded row. Any other
error status (a bad key, an unknown model, a request the server will not take) is a
`ConfigurationError`. The official `openai` client (the `model` extra) sends the requests with
its own retries off, so this module owns and records every attempt; it posts the request as
plain JSON and parses the body itself, so a server's odd response shapes are recorded as they
came.

Every request and response goes to the episode's transcript (given by the harness: the model
arm's `eval.model_arm.Transcript` keeps it in a file), with usage, latency, attempts and the
served model's name. A re-run replays the recorded responses, turn by turn while the request is
the one recorded, before it goes live: an interrupted episode never pays for a turn twice.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from finality_gym import InvalidCall
from finality_gym.economics import DEFAULT_COSTS
from finality_gym.episode import check_call
from finality_gym.tools import chat_tools

from finality_gym.policy import Brief, GiveUp, Policy

PROMPT_FILE = Path(__file__).with_name("prompts") / "system.md"
REMINDER = "No tool was called. Act by calling one of the tools."
PREFLIGHT = "Preflight check before the cases start: reply with anything."
TRANSIENT_STATUS = frozenset({408, 409, 429})


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
    """The endpoint refused the request for a reason retrying cannot fix; stops the run."""


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
    timeout_s: float = 120.0
    max_retries: int = 6
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0

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
        try:
            import openai
        except ImportError as exc:
            raise ImportError("the model arm needs the 'model' extra: pip install -e .[model]") from exc
        self.openai = openai
        self.config = config
        self.client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key(),
                                    max_retries=0, timeout=config.timeout_s)

    def complete(self, request: dict, rng: random.Random,
                 retries: int | None = None) -> tuple[dict, float, int, list[str]]:
        """(body, latency of the successful attempt, attempts, transient errors)."""
        retries = self.config.max_retries if retries is None else retries
        errors: list[str] = []
        for attempt in range(retries + 1):
            started = time.perf_counter()
            wait = None
            try:
                # The client's generic POST: `chat.completions.create` first walks the whole
                # request through its typed-dict transforms, 4 ms a request here, more than the
                # rest of the harness together. The body is read as text and parsed here.
                text = self.client.post("/chat/completions", body=request, cast_to=str)
                latency = time.perf_counter() - started
                try:
                    body = json.loads(text)
                    body["choices"][0]["message"]
                except (ValueError, KeyError, IndexError, TypeError):
                    raise _Unreadable(text[:200]) from None
                return body, latency, attempt + 1, errors
            except _Unreadable as exc:
                errors.append(f"unreadable body: {exc}")
            except self.openai.APITimeoutError:
                errors.append(f"timeout after {self.config.timeout_s} s")
            except self.openai.APIConnectionError as exc:
                errors.append(f"connection error: {exc.__cause__ or exc}")
            except self.openai.APIStatusError as exc:
                status = exc.status_code
                if status not in TRANSIENT_STATUS and status < 500:
                    raise ConfigurationError(_explain(status, exc)) from None
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
        """One small request before a run: a bad key, an unknown model, a server that takes no
        tools, or no server at all (after 3 attempts, not the run's whole retry schedule) stops
        the run here. Returns the served model's name."""
        request = {"model": self.config.model, "tools": chat_tools(), "tool_choice": "auto",
                   "max_tokens": 8,
                   "messages": [{"role": "system", "content": system_prompt()},
                                {"role": "user", "content": PREFLIGHT}]}
        try:
            body, *_ = self.complete(request, random.Random(0), retries=min(
                2, self.config.max_retries))
        except InfrastructureError as exc:
            raise ConfigurationError(f"{self.config.base_url} does not answer ({exc}); is the "
                                     "server running, and is --base-url right?") from None
        return str(body.get("model", self.config.model))


class _Unreadable(Exception):
    pass


def _message(exc) -> str:
    try:
        error = exc.response.json().get("error")
        return str(error.get("message", error) if isinstance(error, dict) else error)[:300]
    except Exception:
        return exc.response.text[:300]


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
    """A tool call's arguments as an object; `InvalidCall` if they are not one."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise InvalidCall(f"arguments must be a JSON object, got {type(raw).__name__}")
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidCall(f"arguments are not valid JSON ({exc.msg} at {exc.pos}): {raw[:80]!r}")
    if not isinstance(args, dict):
        raise InvalidCall(f"arguments must be a JSON object, got {raw[:80]!r}")
    return args


class ModelPolicy(Policy):
    """One model over one endpoint. `transcript`, set per episode by the harness, is anything
    with `recorded(turn, request_sha) -> line | None` (a turn to replay) and `append(line)`."""

    def __init__(self, config: ModelConfig, endpoint: Endpoint | None = None, transcript=None):
        self.config = config
        self.name = f"model:{config.model}"
        self.endpoint = endpoint
        self.transcript = transcript

    def reset(self, brief: Brief) -> None:
        super().reset(brief)
        self.counts = {"requests": 0, "replayed": 0, "retries": 0, "invalid_turns": 0,
                       "tokens_in": 0, "tokens_out": 0}
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
            messages.append({"role": "assistant", "content": message.get("content"),
                             **({"tool_calls": calls} if calls else {})})
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
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""),
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
        params = {"model": c.model, "temperature": c.temperature, "max_tokens": c.max_tokens}
        request = {**params, "messages": messages, "tools": chat_tools(), "tool_choice": "auto"}
        sha = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
        turn = self.counts["requests"]
        line = self.transcript.recorded(turn, sha) if self.transcript is not None else None
        if line is not None:
            self.counts["replayed"] += 1
        else:
            if self.endpoint is None:
                self.endpoint = Endpoint(c)
            body, latency, attempts, errors = self.endpoint.complete(request, self._rng)
            usage = body.get("usage") or {}
            line = {"turn": turn, "request_sha": sha, "new_messages": messages[self._sent:],
                    "params": params, "response": body,
                    "usage": {"prompt_tokens": int(usage.get("prompt_tokens") or 0),
                              "completion_tokens": int(usage.get("completion_tokens") or 0)},
                    "latency_s": round(latency, 4), "attempts": attempts, "errors": errors,
                    "served_model": body.get("model")}
            if self.transcript is not None:
                self.transcript.append(line)
        self._sent = len(messages)
        self.counts["requests"] += 1
        self.counts["retries"] += line["attempts"] - 1
        self.counts["tokens_in"] += line["usage"]["prompt_tokens"]
        self.counts["tokens_out"] += line["usage"]["completion_tokens"]
        return line["response"]["choices"][0]["message"]


def _parse_call(call: dict) -> tuple[str, dict]:
    function = call.get("function") or {}
    tool = function.get("name")
    if not isinstance(tool, str):
        raise InvalidCall("a tool call without a function name")
    args = parse_arguments(function.get("arguments"))
    check_call(tool, args)
    return tool, args
