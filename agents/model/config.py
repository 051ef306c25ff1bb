"""What a model run is (`ModelConfig`): the model and its sampling settings, the caps of an
episode, the endpoint and its key, the retry schedule, the limits on what an endpoint may send,
the prices, and what each request carries (`request_params`: `--param`, `--no-param`). Checked
when it is made, so a bad flag stops the run before any request."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .errors import ConfigurationError
from .prompt import REGIMES

DEFAULT_MAX_RESPONSE_BYTES = 8 << 20     # 8 MiB a response: some 2,000 1,024-token answers
DEFAULT_MAX_TRANSCRIPT_BYTES = 64 << 20  # 64 MiB an episode's transcript (tests': <= 17 KB)
# Request fields the harness sets itself: --param and --no-param may not name them.
OWN_FIELDS = frozenset({"model", "messages", "tools", "tool_choice", "stream", "n"})


@dataclass(frozen=True)
class ModelConfig:
    """What a model run is. The fields that decide a row (the model, its sampling settings and
    caps) are pinned in the run's manifest by the model arm (`eval/models/arm.py`); the endpoint,
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
    regime: str = "open"            # the authority the model has (`prompt.REGIMES`)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model: name the model to call")
        if self.regime not in REGIMES:
            raise ValueError(f"regime: unknown {self.regime!r}; valid: {', '.join(REGIMES)}")
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
