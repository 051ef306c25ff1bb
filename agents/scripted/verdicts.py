"""A read's verdict (docs/world.md section 9): settled, failed (soft or hard) or pending.

The scripted policies decide on these. What each read says is `finality_gym.readings`, the one
reading the env's observations and the timeline also use; a verdict keeps its settled and failed
states and calls the rest (submitted, reversed, shipped, nothing shown) pending. The bank alone has
a rule of its own: any credit line reads as settled, whatever went out again.
"""

from __future__ import annotations

from finality_gym import readings as r
from finality_gym.episode import READS

SETTLED, FAILED_SOFT, FAILED_HARD, PENDING = r.SETTLED, r.FAILED_SOFT, r.FAILED_HARD, r.PENDING
ROTATION = READS  # processor, ledger, ERP, bank: the order the polling policies read in


def _verdict(state: str) -> str:
    return state if state in (SETTLED, FAILED_SOFT, FAILED_HARD) else PENDING


def processor(result: dict) -> str:
    """The newest capture's state."""
    newest = r.newest_capture(result)
    return PENDING if newest is None else _verdict(r.capture_state(newest))


def ledger(result: dict) -> str:
    return _verdict(r.ledger_state(result))


def erp(result: dict) -> str:
    return _verdict(r.ERP_STATE[result["status"]])


def bank(result: dict) -> str:
    return SETTLED if bank_credits(result) > 0 else PENDING


def bank_credits(result: dict) -> int:
    return r.bank_totals(result).credits


BY_READ = {"read_processor": processor, "read_ledger": ledger, "read_erp": erp,
           "read_bank": bank}
