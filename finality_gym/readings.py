"""What a tool's result says about the payment, read one way for every reader of results.

Three readers turn the engine's result dicts into something else: the observation encoder
(`encoder.py`: numbers), the timeline's tracks (`tracks.py`: colours and labels) and the
scripted policies (`agents/scripted/verdicts.py`: settled, failed or pending, docs/world.md section
9). They read the same fields the same way here, so that they cannot drift apart on what, say, a
processor's `failed` with a hard decline, a ledger with cash or the ERP's `payment_failed` means.

A result reads as a *state*. A capture (a processor operation, a probe answer) is `submitted`,
`settled`, `failed_soft`, `failed_hard` or `reversed` (refunded, voided or charged back), a probe
answer also `unknown`; a whole read adds `pending` (nothing final yet), `shipped` (the ERP's goods
left) and `nothing` (nothing shown yet). A failure seen in the ledger or the ERP carries no
decline code, so it reads as a soft decline (a keyed retry is always safe). Each reader keeps what
is its own: the encoder its layout, the picture its colours, the policies their verdicts.
"""

from __future__ import annotations

from typing import NamedTuple

ORIGINAL = "cap1"  # the order's own capture; a fresh retry adds cap2, cap3, ...

SUBMITTED, SETTLED, FAILED_SOFT, FAILED_HARD = "submitted", "settled", "failed_soft", "failed_hard"
REVERSED, UNKNOWN = "reversed", "unknown"
PENDING, SHIPPED, NOTHING = "pending", "shipped", "nothing"

_REVERSED_STATUSES = ("refunded", "voided", "charged_back")
# the ERP's order status (None before its first delivery)
ERP_STATE = {None: NOTHING, "placed": PENDING, "authorized": PENDING, "payment_pending": PENDING,
             "paid": SETTLED, "payment_failed": FAILED_SOFT, "shipped": SHIPPED,
             "refunded": REVERSED, "disputed": REVERSED}


def refused(result: dict) -> bool:
    """The engine refused the call (a probe the arm refuses, a ship after the deadline)."""
    return "error" in result


# ----------------------------------------------------------------- the processor and the probe
def capture_state(op: dict) -> str:
    """One operation of a processor read: its status, a failure split by its decline code, a
    refund, void or chargeback as `reversed`."""
    status = op["status"]
    if status == "failed":
        return FAILED_HARD if op["decline"] == "hard" else FAILED_SOFT
    return REVERSED if status in _REVERSED_STATUSES else status


def original_capture(result: dict) -> dict | None:
    """A processor read's operation cap1, if it shows one."""
    return next((op for op in result["operations"] if op["op"] == ORIGINAL), None)


def newest_capture(result: dict) -> dict | None:
    """A processor read's newest operation (the highest number: the read lists them in order)."""
    ops = result["operations"]
    return ops[-1] if ops else None


def original_answer(result: dict) -> str | None:
    """A probe's answer for cap1 (None for a probe that named no capture)."""
    return result["captures"].get(ORIGINAL)


def newest_answer(result: dict) -> str | None:
    """A probe's answer for its newest capture."""
    captures = result["captures"]
    return captures[max(captures, key=lambda op: int(op[3:]))] if captures else None


# ----------------------------------------------------------------- the ledger and the bank
class LedgerEntries(NamedTuple):
    """How many of a ledger read's entries record each outcome of a capture."""

    settled: int   # capture_settled
    failed: int    # capture_failed
    reversed: int  # refunded, chargeback


def ledger_entries(result: dict) -> LedgerEntries:
    settled = failed = reversed_ = 0
    for entry in result["entries"]:
        memo = entry["memo"]
        if memo == "capture_settled":
            settled += 1
        elif memo == "capture_failed":
            failed += 1
        elif memo in ("refunded", "chargeback"):
            reversed_ += 1
    return LedgerEntries(settled, failed, reversed_)


def ledger_state(result: dict) -> str:
    """Cash in the ledger's cash account settles it; else a failure entry fails it, a refund or a
    chargeback entry reverses it; with no entry at all nothing is shown yet."""
    if result["balances"]["cash"] > 0:
        return SETTLED
    entries = ledger_entries(result)
    if entries.failed:
        return FAILED_SOFT
    if entries.reversed:
        return REVERSED
    return PENDING if result["entries"] else NOTHING


class BankTotals(NamedTuple):
    """A bank read's lines: the sums of its credits and of its debits (both >= 0), and how many
    lines of each."""

    credits: int
    debits: int
    credit_lines: int
    debit_lines: int


def bank_totals(result: dict) -> BankTotals:
    credits = debits = credit_lines = debit_lines = 0
    for line in result["lines"]:
        amount = line["amount"]
        if amount > 0:
            credits += amount
            credit_lines += 1
        elif amount < 0:
            debits -= amount
            debit_lines += 1
    return BankTotals(credits, debits, credit_lines, debit_lines)


def bank_state(result: dict) -> str:
    """The money the lines leave: settled if more came in than went out, else reversed if any
    went out. (The policies' verdict takes any credit line as settled:
    `agents/scripted/verdicts.py`.)"""
    totals = bank_totals(result)
    return (SETTLED if totals.credits > totals.debits else REVERSED if totals.debit_lines
            else NOTHING)
