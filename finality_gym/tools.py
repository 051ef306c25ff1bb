"""The twelve tools as data: name, description and the JSON Schema of the arguments.

This table is what a language model (or any out-of-process agent) is shown; the engine's own call
validation (`episode.check_call`) is what decides. `tests/env/test_tools.py` proves that the two
agree: every argument object the schema accepts the engine accepts, and every one it rejects the
engine rejects with `InvalidCall`. One stricter choice: an `integer` here is a JSON integer literal
(`60`), not a float with no fraction (`60.0`), which JSON Schema itself would admit.

The descriptions state what each tool does and costs, in the world's own terms; none says which
tool to prefer or that waiting helps.
"""

from __future__ import annotations

import hashlib
import json

from .episode import PROBE_TICKS, RETRY_KEYS, TOOLS
from .tasks import ESCALATION_DELAY, SHIP_BY

_NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}

TOOL_TABLE: tuple[dict, ...] = (
    {"name": "read_processor",
     "description": "Read the payment processor's replica: every capture operation it knows of "
                    "for this order and its status, with the decline code ('soft' or 'hard') of "
                    "a failed one. Like every replica it can lag, miss or repeat events. 1 tick.",
     "parameters": _NO_ARGS},
    {"name": "read_ledger",
     "description": "Read the accounting ledger: its journal entries and the balances of the "
                    "clearing, cash and sales accounts, plus the imbalance (debits - credits), in "
                    "cents. Like every replica it can lag, miss or repeat events. 1 tick.",
     "parameters": _NO_ARGS},
    {"name": "read_erp",
     "description": "Read the ERP's status of this order. Like every replica it can lag, miss or "
                    "repeat events. 1 tick.",
     "parameters": _NO_ARGS},
    {"name": "read_bank",
     "description": "Read the bank statement lines of this order: posted time, signed amount in "
                    "cents and kind; the lines carry no operation ids. Like every replica it can "
                    "lag, miss or repeat events. 1 tick.",
     "parameters": _NO_ARGS},
    {"name": "probe_processor",
     "description": "Ask the processor's settlement system directly, not a replica: for each "
                    "capture operation, the outcome of its latest attempt ('settled', "
                    "'failed_soft', 'failed_hard') if that outcome is determined at the time of "
                    "the call, else 'unknown'. Some deployments restrict or refuse it; a refused "
                    f"probe still costs its call and its ticks. {PROBE_TICKS} ticks.",
     "parameters": _NO_ARGS},
    {"name": "wait",
     "description": "Let time pass. Never past the horizon. Costs the ticks waited.",
     "parameters": {"type": "object",
                    "properties": {"ticks": {"type": "integer", "minimum": 1,
                                             "description": "how many ticks to wait (>= 1)"}},
                    "required": ["ticks"], "additionalProperties": False}},
    {"name": "retry_capture",
     "description": "Retry the card capture. key='original' repeats the original capture under "
                    "its idempotency key: nothing happens while that capture is pending or "
                    "settled; after a decline it submits a new attempt of it. key='fresh' "
                    "submits a new capture operation for the full order value under a new key: "
                    "a second, separate charge, which cannot be undone. The acknowledgement is "
                    "the same in every case. 1 tick.",
     "parameters": {"type": "object",
                    "properties": {"key": {"type": "string", "enum": list(RETRY_KEYS)}},
                    "required": ["key"], "additionalProperties": False}},
    {"name": "ship",
     "description": "Ship the goods to the customer. Irreversible; ends the case. Refused after "
                    f"the ship-by deadline (t={SHIP_BY}: the customer has cancelled), in which "
                    "case the call and its tick are spent and the case goes on. 1 tick.",
     "parameters": _NO_ARGS},
    {"name": "refund",
     "description": "Cancel the order: refund every capture settled so far and void every "
                    "pending one. Irreversible; ends the case. 1 tick.",
     "parameters": _NO_ARGS},
    {"name": "write_off",
     "description": "Cancel the order and void every pending capture, refunding nothing already "
                    "settled. Irreversible; ends the case. 1 tick.",
     "parameters": _NO_ARGS},
    {"name": "escalate",
     "description": "Hand the case to a specialist, for the escalation fee. Irreversible; ends "
                    f"the case. The specialist acts {ESCALATION_DELAY} ticks later on the true "
                    "state of the payment: if at least the order value has settled and it is "
                    f"still at or before t={SHIP_BY}, ships (refunding any over-collection, "
                    "voiding anything pending); otherwise refunds everything. 1 tick.",
     "parameters": _NO_ARGS},
    {"name": "close",
     "description": "Close the case as it stands: nothing shipped, nothing refunded, pending "
                    "captures run on. Irreversible; ends the case. 1 tick.",
     "parameters": _NO_ARGS},
)
assert tuple(t["name"] for t in TOOL_TABLE) == TOOLS


def chat_tools() -> list[dict]:
    """The table in the Chat Completions `tools` form."""
    return [{"type": "function", "function": dict(t)} for t in TOOL_TABLE]


def tools_hash() -> str:
    """SHA-256 (16 hex digits) of the table's canonical JSON: pinned in a run's manifest."""
    text = json.dumps(TOOL_TABLE, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
