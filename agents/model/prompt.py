"""What the model is told: the system prompt (`agents/model/system.md`, the rules an agent is
told, with the world's constants filled in; it names no tool to prefer), the first user message
(the case brief as JSON, never the seed), the reminder after a reply without a tool call, the
preflight's question, and each tool result as JSON. The prompt's hash pins a run's prompt in its
manifest, so a resume under a changed prompt is refused.

The regime (`REGIMES`: how much authority the prompt gives the model) adds to the system prompt:
- `open`: `system.md` alone: the model decides;
- `procedure`: and `procedure.md`, a written operating procedure (which evidence permits which
  disposition, the rules of the guard, `finality_gym/guard.py`, in words) that also says
  withholding a verified order is a violation: a rule set that only listed reasons to hold
  would teach blanket refusal;
- `guarded`: and `guarded.md`: the same rules, enforced (the run plays every episode behind the
  guard, so a call they do not permit is refused with a tool error): the model advises, the
  guard acts.
Every part is the same for every case, so no regime tells one case from another."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from finality_gym.economics import DEFAULT_COSTS
from finality_gym.policy import Brief

PROMPT_FILE = Path(__file__).with_name("system.md")
REGIMES = ("open", "procedure", "guarded")
REGIME_FILES = {"open": (), "procedure": ("procedure.md",),
                "guarded": ("procedure.md", "guarded.md")}
REMINDER = "No tool was called. Act by calling one of the tools."
PREFLIGHT = "Preflight check before the cases start: reply with anything."


def system_prompt(regime: str = "open") -> str:
    """The system prompt of a regime with the world's constants filled in (the files hold
    placeholders)."""
    from finality_gym.guard import MARGIN_CALLS, MARGIN_TICKS
    from finality_gym.tasks import CALL_BUDGET, HANDOVER_AT, HORIZON, SHIP_BY
    if regime not in REGIMES:
        raise ValueError(f"regime: unknown {regime!r}; valid: {', '.join(REGIMES)}")
    text = "".join(PROMPT_FILE.with_name(name).read_text()
                   for name in (PROMPT_FILE.name, *REGIME_FILES[regime]))
    return text.format(
        handover_at=HANDOVER_AT, budget=CALL_BUDGET, horizon=HORIZON, ship_by=SHIP_BY,
        cogs_percent=round(DEFAULT_COSTS.cogs_fraction * 100),
        dispute_fee=DEFAULT_COSTS.dispute_fee, escalation_fee=DEFAULT_COSTS.escalation_fee,
        margin_calls=MARGIN_CALLS, refund_from=SHIP_BY - MARGIN_TICKS)


def prompt_hash(regime: str = "open") -> str:
    return hashlib.sha256(system_prompt(regime).encode()).hexdigest()[:16]


def brief_message(brief: Brief) -> str:
    """The first user message: the brief as JSON, without the seed."""
    fields = {"order_value": brief.order_value, "now": brief.handover_at,
              "ship_by": brief.ship_by, "horizon": brief.horizon, "calls_left": brief.budget,
              "probe_arm": brief.probe}
    return ("A new case has been handed to you. Money is in cents, times in ticks.\n"
            + json.dumps(fields))


def result_content(result: dict) -> str:
    return json.dumps(result, separators=(",", ":"))
