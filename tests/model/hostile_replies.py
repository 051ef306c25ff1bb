"""The gate's case played by the model behind a scripted chat server whose replies a test
edits: the hooks that edit an episode's first turn (`first_turn`, `at_first_turn`), how the
case ends (`outcome`: a graded row or the endpoint's infrastructure error, nothing else), and
the gate's own record of it to compare with. For the tests of hostile replies
(`test_model_replies.py`, `test_model_reply_fuzz.py`, `test_model_reply_redteam.py`). A test
helper, not a test module."""

from __future__ import annotations

import copy

from agents import make_policy, run_episode
from agents.model import PREFLIGHT, InfrastructureError, ModelPolicy
from finality_gym import load_corpus

from tests.model.model_client import config

TASK = "pub-000b-pending_fail"
DEEP = 200_000  # the red team's depth
RECORD = ("disposition", "gap", "calls_used", "lapsed", "premature")


def deep(n: int) -> str:
    return "[" * n + "]" * n


def first_turn(body: dict) -> bool:
    """A request of an episode's first turn (every attempt of it), not the preflight."""
    messages = body.get("messages") or []
    return (not any(m.get("role") == "assistant" for m in messages)
            and not any(m.get("content") == PREFLIGHT for m in messages))


def at_first_turn(edit):
    """A `rewrite` hook: `edit` (the scripted reply, a copy, -> dict or bytes) answers every
    attempt of each episode's first turn; later turns are answered as the scripted model
    would."""
    return lambda n, body, reply: edit(copy.deepcopy(reply)) if first_turn(body) else None


def outcome(server, **kw) -> tuple[str, object, dict]:
    """The gate's case `TASK` played by the model behind `server`: ("row", record, stats) or
    ("infrastructure", message, stats). Any other exception is a failed test."""
    policy = ModelPolicy(config(server, **kw))
    try:
        record = run_episode(policy, load_corpus("public").task(TASK), 0)
    except InfrastructureError as exc:
        return "infrastructure", str(exc), policy.stats()
    return "row", record, policy.stats()


def gate_record():
    record = run_episode(make_policy("finality_gate"), load_corpus("public").task(TASK), 0)
    return {field: getattr(record, field) for field in RECORD}
