"""Whose failure it is. Infrastructure is not the agent: an endpoint that fails past every retry
(`InfrastructureError`) costs the episode its row, and a re-run redoes it; a request the
endpoint will never take (`ConfigurationError`) stops the run; a conversation that outgrew the
model's context (`ContextOverflow`, recognised by `context_overflow` in any server's words) is a
lapse of its case mid-episode and a configuration error only at preflight. A reply the harness
cannot believe (`UnreadableReply`) is the endpoint's failure, retried like a timeout."""

from __future__ import annotations

import re


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


class ContextOverflow(ConfigurationError):
    """The conversation no longer fits the model's context: a lapse mid-episode."""


class UnreadableReply(Exception):
    """A reply that is not a Chat Completions reply the harness can believe (`check_reply`
    says what is wrong): the endpoint's failure, retried like a timeout."""


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
