"""What the model is told: the system prompt (`agents/model/system.md`, the rules an agent is
told, with the world's constants filled in; it names no tool to prefer), the first user message
(the case brief as JSON, never the seed), the reminder after a reply without a tool call, the
preflight's question, and each tool result as JSON. The prompt's hash pins a run's prompt in its
manifest, so a resume under a changed prompt is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from finality_gym.economics import DEFAULT_COSTS
from finality_gym.policy import Brief

PROMPT_FILE = Path(__file__).with_name("system.md")
REMINDER = "No tool was called. Act by calling one of the tools."
PREFLIGHT = "Preflight check before the cases start: reply with anything."


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
