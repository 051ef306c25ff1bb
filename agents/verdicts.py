"""A read's verdict (docs/world.md section 9). A failure seen in the ledger or the ERP carries no decline
code, so it reads as a soft decline (a keyed retry is always safe)."""

from __future__ import annotations

SETTLED, FAILED_SOFT, FAILED_HARD, PENDING = "settled", "failed_soft", "failed_hard", "pending"


def processor(result: dict) -> str:
    """The newest capture's status: settled / failed (with its decline) / else pending."""
    ops = result["operations"]
    if not ops:
        return PENDING
    newest = ops[-1]
    if newest["status"] == "settled":
        return SETTLED
    if newest["status"] == "failed":
        return FAILED_HARD if newest["decline"] == "hard" else FAILED_SOFT
    return PENDING


def ledger(result: dict) -> str:
    if result["balances"]["cash"] > 0:
        return SETTLED
    if any(entry["memo"] == "capture_failed" for entry in result["entries"]):
        return FAILED_SOFT
    return PENDING


def erp(result: dict) -> str:
    status = result["status"]
    if status == "paid":
        return SETTLED
    if status == "payment_failed":
        return FAILED_SOFT
    return PENDING


def bank(result: dict) -> str:
    return SETTLED if bank_credits(result) > 0 else PENDING


def bank_credits(result: dict) -> int:
    return sum(line["amount"] for line in result["lines"] if line["amount"] > 0)


BY_READ = {"read_processor": processor, "read_ledger": ledger, "read_erp": erp,
           "read_bank": bank}
ROTATION = ("read_processor", "read_ledger", "read_erp", "read_bank")
