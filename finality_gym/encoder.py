"""The observation encoder of `Finality-v0`, shared by the env and the learned-policy adapter.

It decodes tool results (never the truth), read as `readings` reads them for every reader, into
one preallocated float32 vector, so a policy trained on the env sees exactly the same observations
when the grader runs it through the engine. The table of every index is in `FinalityEnv`'s
docstring.
"""

from __future__ import annotations

import math

import numpy as np

from . import readings as r
from .episode import READS
from .tasks import CALL_BUDGET, HANDOVER_AT, HORIZON, ORDER_VALUES, SHIP_BY

DEFAULT_WAITS = (10, 30, 60, 120)
_MAX_OV_LOG = math.log(max(ORDER_VALUES))
PROC_STATUSES = ("absent", "submitted", "settled", "failed_soft", "failed_hard", "reversed")
PROBE_STATUSES = ("none", "unknown", "settled", "failed_soft", "failed_hard", "submitted")
ERP_STATUSES = (None, "placed", "authorized", "payment_pending", "paid", "payment_failed",
                "shipped", "refunded", "disputed")
_PROC_INDEX = {s: i for i, s in enumerate(PROC_STATUSES)}  # by `readings.capture_state`
_PROBE_INDEX = {s: i for i, s in enumerate(PROBE_STATUSES)}
_ERP_INDEX = {s: i for i, s in enumerate(ERP_STATUSES)}


def _layout() -> list[tuple[str, float, float]]:
    """(name, low, high) of every observation index, in order; the docstring's table is this."""
    fields = [("time_since_handover", 0, 1), ("time_to_deadline", 0, 1), ("calls_left", 0, 1),
              ("order_value_log", 0, 1)]
    for system in ("processor", "ledger", "erp", "bank"):
        fields += [(f"{system}_read", 0, 1), (f"{system}_read_age", 0, 1)]
        if system == "processor":
            fields += [(f"processor_original_{s}", 0, 1) for s in PROC_STATUSES]
            fields += [(f"processor_newest_{s}", 0, 1) for s in PROC_STATUSES]
            fields += [("processor_captures", 0, 1)]
        elif system == "ledger":
            fields += [("ledger_cash", -4, 4), ("ledger_clearing", -4, 4),
                       ("ledger_imbalance", -4, 4), ("ledger_settlement_entries", 0, 1),
                       ("ledger_failure_entries", 0, 1)]
        elif system == "erp":
            fields += [(f"erp_{s or 'unknown'}", 0, 1) for s in ERP_STATUSES]
        else:
            fields += [("bank_credits", 0, 4), ("bank_debits", 0, 4), ("bank_credit_lines", 0, 1)]
    fields += [(f"probe_original_{s}", 0, 1) for s in PROBE_STATUSES]
    fields += [(f"probe_newest_{s}", 0, 1) for s in PROBE_STATUSES]
    fields += [("probe_age", 0, 1), ("retries_original", 0, 1), ("retries_fresh", 0, 1),
               ("last_call_refused", 0, 1)]
    return fields


OBS_FIELDS = _layout()
_I = {name: i for i, (name, _, _) in enumerate(OBS_FIELDS)}
_SYS_READ = tuple(_I[f"{s}_read"] for s in ("processor", "ledger", "erp", "bank"))
_AGE_SLOTS = tuple(_I[f"{s}_read_age"] for s in ("processor", "ledger", "erp", "bank")) + (
    _I["probe_age"],)
_PROBE_ORIGINAL = _I["probe_original_none"]
_PROBE_NEWEST = _I["probe_newest_none"]
_RETRIES_ORIGINAL = _I["retries_original"]
_RETRIES_FRESH = _I["retries_fresh"]
_REFUSED = _I["last_call_refused"]
# The clock's four fields, by time (and calls used), computed once: the same values as the
# formulas in `FinalityEnv`'s table, looked up at every step instead of computed.
_ELAPSED = tuple((now - HANDOVER_AT) / (HORIZON - HANDOVER_AT) for now in range(HORIZON + 1))
_TO_DEADLINE = tuple(max(0, SHIP_BY - now) / (SHIP_BY - HANDOVER_AT) for now in range(HORIZON + 1))
_CALLS_LEFT = tuple((CALL_BUDGET - used) / CALL_BUDGET for used in range(CALL_BUDGET + 1))
_AGE = tuple(min(age, HORIZON) / HORIZON for age in range(HORIZON + 1))
_START = np.zeros(len(OBS_FIELDS), dtype=np.float32)  # nothing read, no probe answer yet
_START[list(_AGE_SLOTS)] = 1.0
_START[[_PROBE_ORIGINAL, _PROBE_NEWEST]] = 1.0


def action_table(wait_ticks: tuple[int, ...] = DEFAULT_WAITS) -> tuple[tuple[str, dict], ...]:
    """The (tool, args) of every discrete action, in index order."""
    return (tuple((tool, {}) for tool in READS) + (("probe_processor", {}),)
            + tuple(("wait", {"ticks": w}) for w in wait_ticks)
            + (("retry_capture", {"key": "original"}), ("retry_capture", {"key": "fresh"}))
            + tuple((tool, {}) for tool in ("ship", "refund", "write_off", "escalate", "close")))


class ObservationEncoder:
    """Keeps the observation of one episode up to date, one tool result at a time."""

    __slots__ = ("actions", "ship", "retry", "obs", "order_value", "_last_read", "_masks")

    def __init__(self, wait_ticks: tuple[int, ...] = DEFAULT_WAITS):
        self.actions = action_table(wait_ticks)
        self.ship = len(self.actions) - 5
        self.retry = self.ship - 2
        self.obs = np.zeros(len(OBS_FIELDS), dtype=np.float32)
        masks = np.ones((2, 2, len(self.actions)), dtype=bool)  # [ship refused][probe refused]
        masks[1, :, self.ship] = False
        masks[:, 1, 4] = False
        self._masks = tuple(tuple(row) for row in masks)
        self.order_value = 1
        self._last_read: dict[int, int] = {}  # age slot -> time of the last read (or probe)

    def reset(self, order_value: int) -> np.ndarray:
        obs = self.obs
        obs[:] = _START
        obs[3] = math.log(order_value) / _MAX_OV_LOG
        self.order_value = order_value
        self._last_read = {}
        self._clock(HANDOVER_AT, 0)
        return obs

    def update(self, action: int, result: dict, now: int, calls_used: int) -> np.ndarray:
        """Fold the result of `action` in; `now` and `calls_used` are as after the call."""
        obs = self.obs
        refused = r.refused(result)
        obs[_REFUSED] = 1.0 if refused else 0.0
        if action < 4:
            self._last_read[_AGE_SLOTS[action]] = result["t"]
            obs[_SYS_READ[action]] = 1.0
            _DECODERS[action](obs, result, self.order_value)
        elif action == 4:
            if not refused:
                self._last_read[_AGE_SLOTS[4]] = result["t"]
                obs[_PROBE_ORIGINAL:_PROBE_NEWEST + len(PROBE_STATUSES)] = 0.0
                obs[_PROBE_ORIGINAL + _PROBE_INDEX[r.original_answer(result) or "none"]] = 1.0
                obs[_PROBE_NEWEST + _PROBE_INDEX[r.newest_answer(result) or "none"]] = 1.0
        elif action == self.retry:
            obs[_RETRIES_ORIGINAL] = min(obs[_RETRIES_ORIGINAL] + 0.25, 1.0)
        elif action == self.retry + 1:
            obs[_RETRIES_FRESH] = min(obs[_RETRIES_FRESH] + 0.25, 1.0)
        self._clock(now, calls_used)
        return obs

    def masks(self, now: int, probe: str, probes_answered: int) -> np.ndarray:
        """`ship` after the ship-by deadline; the probe where the arm refuses it. A copy of
        one of four masks made once (4 times faster than a new array)."""
        return self.shared_mask(now, probe, probes_answered).copy()

    def shared_mask(self, now: int, probe: str, probes_answered: int) -> np.ndarray:
        """`masks` without the copy: the encoder's own array, to be copied into another (the
        vector env's batch), never handed out."""
        return self._masks[now > SHIP_BY][probe == "none" or (
            probe == "rate_limited" and probes_answered >= 2)]

    def _clock(self, now: int, calls_used: int) -> None:
        obs = self.obs
        obs[0] = _ELAPSED[now]
        obs[1] = _TO_DEADLINE[now]
        obs[2] = _CALLS_LEFT[calls_used]
        for slot, last in self._last_read.items():
            obs[slot] = _AGE[now - last]


def _decode_processor(obs: np.ndarray, result: dict, ov: int) -> None:
    obs[6:18] = 0.0
    original, newest = r.original_capture(result), r.newest_capture(result)
    obs[6 + (0 if original is None else _PROC_INDEX[r.capture_state(original)])] = 1.0
    obs[12 + (0 if newest is None else _PROC_INDEX[r.capture_state(newest)])] = 1.0
    obs[18] = min(len(result["operations"]) / 4, 1.0)


def _decode_ledger(obs: np.ndarray, result: dict, ov: int) -> None:
    balances = result["balances"]
    obs[21] = min(max(balances["cash"] / ov, -4.0), 4.0)
    obs[22] = min(max(balances["clearing"] / ov, -4.0), 4.0)
    obs[23] = min(max(result["imbalance"] / ov, -4.0), 4.0)
    entries = r.ledger_entries(result)
    obs[24] = min(entries.settled / 4, 1.0)
    obs[25] = min(entries.failed / 4, 1.0)


def _decode_erp(obs: np.ndarray, result: dict, ov: int) -> None:
    obs[28:37] = 0.0
    obs[28 + _ERP_INDEX[result["status"]]] = 1.0


def _decode_bank(obs: np.ndarray, result: dict, ov: int) -> None:
    totals = r.bank_totals(result)
    obs[39] = min(totals.credits / ov, 4.0)
    obs[40] = min(totals.debits / ov, 4.0)
    obs[41] = min(totals.credit_lines / 4, 1.0)


_DECODERS = (_decode_processor, _decode_ledger, _decode_erp, _decode_bank)
