"""The hidden truth: capture attempts, agent effects and the canonical log (docs/world.md sections 2 and 5).

`World` holds only what the position depends on: the attempts of every capture operation, the
agent's effects, the escalation specialist and the chargeback. It knows nothing of replicas,
faults or tools. The log is realised lazily: `advance(t)` appends every scheduled event with time
<= t (so a scheduled event "enters the log when the clock reaches it"), and agent effects are
appended at the time of the call, after the world events of that tick.

Choices where the rules are silent:
- `retry_capture("original")` concerns `cap1` only; fresh captures are new operations `cap2`,
  `cap3`, ... each with a single attempt.
- A refund or a chargeback is one event per capture, each for that capture's full amount.
- An attempt voided at `v` has no outcome if it would be determined after `v`; one determined at
  exactly `v` was observed as determined by the call at `v` and is not voided.
- Events of one tick are ordered: attempt outcomes (by operation, attempt), the specialist's
  actions, the chargeback; then the agent's effects of that tick.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from .tasks import (AUTHORIZED_AT, CAPTURE_SUBMITTED_AT, ESCALATION_DELAY, HORIZON,
                    ORDER_PLACED_AT, SHIP_BY, Task)

DISPOSITIONS = ("ship", "refund", "write_off", "escalate", "close")
_EFFECT_KIND = {"ship": "shipped", "write_off": "written_off", "escalate": "escalated",
                "close": "closed"}

# Event identity phases: an event's identity is (phase, op number, attempt number). The outcome of
# an attempt has one phase whether it settles or fails, so the halves of a twin pair share it.
_PHASE = {"order_placed": 0, "authorized": 1, "capture_submitted": 2, "capture_settled": 3,
          "capture_failed": 3, "refunded": 4, "capture_voided": 5, "chargeback": 6, "shipped": 7,
          "escalated": 8, "closed": 9, "written_off": 10}


class Event(NamedTuple):
    seq: int
    t: int
    kind: str
    op: str | None
    amount: int
    attrs: dict | None
    ident: int  # (phase, op, attempt) packed: the delivery identity used by the fault draws


_new_event = tuple.__new__


class Attempt:
    """One attempt of one capture operation; `voided_at` is set when it is voided while pending."""

    __slots__ = ("op", "n", "submitted_at", "determined_at", "outcome", "voided_at", "refunded",
                 "charged_back")

    def __init__(self, op: int, n: int, submitted_at: int, determined_at: int, outcome: str):
        self.op = op
        self.n = n
        self.submitted_at = submitted_at
        self.determined_at = determined_at
        self.outcome = outcome  # settled | failed_soft | failed_hard
        self.voided_at: int | None = None
        self.refunded = False
        self.charged_back = False

    def determined(self, t: int) -> bool:
        return self.determined_at <= t and self.voided_at is None

    def settled(self, t: int) -> bool:
        return self.outcome == "settled" and self.determined_at <= t and self.voided_at is None

    def pending(self, t: int) -> bool:
        return self.determined_at > t and self.voided_at is None


@lru_cache(maxsize=None)
def _opening(order_value: int) -> tuple[Event, ...]:
    """The log's first three events, the same in every world of an order value: made once each
    (events are immutable, and nothing writes to an event's `attrs`), as a world is made at every
    episode's start."""
    return (Event(0, ORDER_PLACED_AT, "order_placed", None, order_value, None, 0),
            Event(1, AUTHORIZED_AT, "authorized", None, order_value, None, 1 << 16),
            Event(2, CAPTURE_SUBMITTED_AT, "capture_submitted", "cap1", order_value,
                  {"attempt": 1}, (2 << 16) | (1 << 8) | 1))


def attempt_outcome(fate: str, op: int, n: int) -> str:
    """docs/world.md section 2: the card fate decides every attempt."""
    if fate == "settle":
        return "settled"
    if fate == "fail_soft":
        return "failed_soft" if (op == 1 and n == 1) else "settled"
    return "failed_hard"


class World:
    __slots__ = ("task", "attempts", "log", "clock", "specialist_at", "_specialist_done",
                 "_chargeback_done", "ended_at")

    def __init__(self, task: Task):
        self.task = task
        self.attempts = [Attempt(1, 1, CAPTURE_SUBMITTED_AT, task.t_det,
                                 attempt_outcome(task.fate, 1, 1))]
        self.log = list(_opening(task.order_value))
        self.clock = CAPTURE_SUBMITTED_AT
        self.specialist_at: int | None = None
        self._specialist_done = False
        self._chargeback_done = task.chargeback_at is None
        self.ended_at: int | None = None

    # ----------------------------------------------------------------- the log
    def _append(self, t: int, kind: str, op: int, n: int, amount: int, attrs: dict | None) -> None:
        # tuple.__new__: the Event itself, without NamedTuple's Python-level constructor
        self.log.append(_new_event(Event, (len(self.log), t, kind, f"cap{op}" if op else None,
                                           amount, attrs, (_PHASE[kind] << 16) | (op << 8) | n)))

    def advance(self, now: int) -> None:
        """Append every scheduled world event with time <= now, in time order."""
        while True:
            t_next = self._next_scheduled()
            if t_next is None or t_next > now:
                break
            for a in self.attempts:
                if a.determined_at == t_next and a.voided_at is None:
                    if a.outcome == "settled":
                        self._append(t_next, "capture_settled", a.op, a.n, self.task.order_value,
                                     {"attempt": a.n})
                    else:
                        self._append(t_next, "capture_failed", a.op, a.n, self.task.order_value,
                                     {"attempt": a.n, "decline": a.outcome[7:]})
            if self.specialist_at == t_next:
                self._specialist_done = True
                self._specialist(t_next)
            if self.task.chargeback_at == t_next:
                self._chargeback_done = True
                self._chargeback(t_next)
            self.clock = t_next
        if now > self.clock:
            self.clock = now

    def _next_scheduled(self) -> int | None:
        clock = self.clock
        best = None
        for a in self.attempts:
            d = a.determined_at
            if d > clock and a.voided_at is None and (best is None or d < best):
                best = d
        if not self._specialist_done and self.specialist_at is not None:
            if best is None or self.specialist_at < best:
                best = self.specialist_at
        if not self._chargeback_done:
            cb = self.task.chargeback_at
            if best is None or cb < best:
                best = cb
        return best

    # ----------------------------------------------------------------- agent actions
    def latest(self, op: int) -> Attempt:
        return max((a for a in self.attempts if a.op == op), key=lambda a: a.n)

    def retry(self, key: str, now: int) -> None:
        """`original`: a new attempt of cap1 only after its latest attempt has declined; `fresh`:
        a new capture operation. Either kind of attempt is determined at max(now + R, t_det)."""
        self.advance(now)
        task = self.task
        determined_at = max(now + task.retry_latency, task.t_det)
        if key == "original":
            last = self.latest(1)
            if not (last.determined(now) and last.outcome != "settled"):
                return
            op, n = 1, last.n + 1
        else:
            op, n = max(a.op for a in self.attempts) + 1, 1
        self.attempts.append(Attempt(op, n, now, determined_at, attempt_outcome(task.fate, op, n)))
        self._append(now, "capture_submitted", op, n, task.order_value, {"attempt": n})

    def dispose(self, action: str, now: int) -> None:
        """Apply one of the five dispositions at `now`, then run the world on to the horizon."""
        self.advance(now)
        if action == "refund":
            self._refund_all(now)
        elif action == "write_off":
            self._void_pending(now)
        if action in _EFFECT_KIND:
            self._append(now, _EFFECT_KIND[action], 0, 0, 0, None)
        if action == "escalate":
            self.specialist_at = now + ESCALATION_DELAY
        self.ended_at = now
        self.advance(HORIZON)

    def _void_pending(self, now: int) -> None:
        for a in self.attempts:
            if a.pending(now):
                a.voided_at = now
                self._append(now, "capture_voided", a.op, a.n, self.task.order_value, {"attempt": a.n})

    def _refund(self, a: Attempt, now: int) -> None:
        a.refunded = True
        self._append(now, "refunded", a.op, a.n, self.task.order_value, {"attempt": a.n})

    def _refund_all(self, now: int) -> None:
        for a in self.attempts:
            if a.settled(now) and not a.refunded and not a.charged_back:
                self._refund(a, now)
        self._void_pending(now)

    def _specialist(self, t: int) -> None:
        """docs/world.md section 5: ship if the order value has settled by t <= SHIP_BY (refunding any
        over-collection, voiding anything pending); otherwise refund everything."""
        held = [a for a in self.attempts if a.settled(t) and not a.refunded and not a.charged_back]
        if held and t <= SHIP_BY:
            self._append(t, "shipped", 0, 0, 0, None)
            for a in held[1:]:
                self._refund(a, t)
            self._void_pending(t)
        else:
            self._refund_all(t)

    def _chargeback(self, t: int) -> None:
        """The customer disputes the order: every settled, unrefunded capture is clawed back."""
        for a in self.attempts:
            if a.settled(t) and not a.refunded and not a.charged_back:
                a.charged_back = True
                self._append(t, "chargeback", a.op, a.n, self.task.order_value, {"attempt": a.n})

    # ----------------------------------------------------------------- authoritative view
    def probe(self, t: int) -> dict[str, str]:
        """For each capture operation existing at t, its latest attempt's outcome if determined."""
        out: dict[str, str] = {}
        for a in self.attempts:
            if a.submitted_at <= t:
                out[f"cap{a.op}"] = a.outcome if a.determined_at <= t else "unknown"
        return out

    def operations(self, t: int) -> list[str]:
        return sorted({f"cap{a.op}" for a in self.attempts if a.submitted_at <= t})
