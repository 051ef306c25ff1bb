"""The four replica systems (docs/world.md section 3) and the delivery faults that feed them (section 4).

Deliveries are built lazily, per system, only when a read of that system needs them (or when the
episode record counts fault firings), and incrementally: the canonical log only grows at its end,
and a delivery's faults depend on its own identity and on the previous canonical event's delivery
to the same system, never on later events, so earlier deliveries never need rebuilding.

Choices where the rules are silent:
- The copy made by a duplicate is a clean copy: it is not half-committed and never reordered.
- A reorder needs a previous delivery to pair with: none if the previous canonical event's delivery
  to that system was lost, or if it already swapped.
- Archetype faults concern the original attempt of `cap1` only. A forced loss leaves no room for
  profile faults; a forced duplicate or half-commit makes the profile's own draw of that family
  take no effect (and so it is not counted).
- `stale_processor`: a processor read shows the replica as of max(t - lag - L, 20), lag being the
  profile's stale-read lag (0 when it does not fire).
- Ledger balances: cash and clearing are debit-normal (debits - credits), sales is credit-normal.
- `fault_firings` counts the profile firings that took effect on what the agent could observe:
  the deliveries to each system of the events up to the agent's last read of that system, and
  the agent's reads. A fault on a delivery to a system nobody read changed nothing in the
  episode, and counting it would mean building every system's deliveries for every episode,
  which would triple the cost of a short one.
"""

from __future__ import annotations

import operator

from .faults import FAMILIES, GOLDEN, MASK64, FaultProfile, draw, episode_key, mix64
from .tasks import HORIZON, Task
from .world import Event, World

PROCESSOR, LEDGER, ERP, BANK = range(4)
LATENCY = (2, 5, 15, 0)
BANK_BATCH = 60
STALE_PROCESSOR_FLOOR = 20
LOSS, DELAY, DUPLICATE, PARTIAL, REORDER, STALE = range(6)
assert FAMILIES == ("loss", "delay", "duplicate", "partial_commit", "reorder", "stale_read")

_P, _L, _E, _B = 1, 2, 4, 8
_RECEIVERS = {  # which systems each canonical event kind is delivered to
    "order_placed": _E, "authorized": _E, "capture_submitted": _P | _L | _E,
    "capture_settled": _P | _L | _E | _B, "capture_failed": _P | _L | _E,
    "refunded": _P | _L | _E | _B, "capture_voided": _P, "chargeback": _P | _L | _E | _B,
    "shipped": _E,
}
_CAP1_OUTCOME = (3 << 16) | (1 << 8) | 1
_PROCESSOR_STATUS = {"capture_submitted": "submitted", "capture_settled": "settled",
                     "capture_failed": "failed", "refunded": "refunded",
                     "capture_voided": "voided", "chargeback": "charged_back"}
_ERP_STATUS = {"order_placed": "placed", "authorized": "authorized",
               "capture_submitted": "payment_pending", "capture_settled": "paid",
               "capture_failed": "payment_failed", "shipped": "shipped", "refunded": "refunded",
               "chargeback": "disputed"}
_LEDGER_LEGS = {  # (debit account, credit account)
    "capture_submitted": ("clearing", "sales"), "capture_settled": ("cash", "clearing"),
    "capture_failed": ("sales", "clearing"), "refunded": ("sales", "cash"),
    "chargeback": ("sales", "cash"),
}
_BANK_KIND = {"capture_settled": "settlement", "refunded": "refund", "chargeback": "chargeback"}
_SECOND_WORD = 0x5851F42D4C957F2D


def _forced(archetype: str, system: int, event: Event) -> str | None:
    """The archetype fault on one delivery, if any (docs/world.md section 6)."""
    if event.ident != _CAP1_OUTCOME:
        return None
    settled = event.kind == "capture_settled"
    if archetype == "lost_settlement" and settled and system in (PROCESSOR, ERP):
        return "loss"
    if archetype == "duplicate_settlement" and settled and system in (LEDGER, BANK):
        return "duplicate"
    if archetype == "partial_ledger" and settled and system == LEDGER:
        return "partial"
    if archetype == "hard_decline" and not settled and system == LEDGER:
        return "loss"
    return None


class Replicas:
    """The replica side of one episode: deliveries per system, folds, and the firing counts."""

    __slots__ = ("world", "task", "key", "thr", "deliveries", "synced", "prev", "firings")

    def __init__(self, world: World, task: Task, seed: int, faults: FaultProfile):
        self.world = world
        self.task = task
        self.key = episode_key(task.fault_key, seed)
        self.thr = faults.thresholds
        self.deliveries: tuple[list, ...] = ([], [], [], [])
        self.synced = [0, 0, 0, 0]  # log index up to which each system's deliveries are built
        self.prev: list = [None, None, None, None]  # last primary delivery, for reorder pairing
        self.firings = [0, 0, 0, 0, 0, 0]

    # ----------------------------------------------------------------- deliveries
    def sync(self, system: int, until_t: int) -> None:
        """Build the deliveries to `system` of every logged event with time <= until_t."""
        log = self.world.log
        i = self.synced[system]
        bit = 1 << system
        while i < len(log) and log[i].t <= until_t:
            event = log[i]
            if _RECEIVERS.get(event.kind, 0) & bit:
                self._deliver(system, event)
            i += 1
        self.synced[system] = i

    def _deliver(self, system: int, event: Event) -> None:
        """One delivery, its faults applied in the order of docs/world.md section 4: loss, delay, duplicate; then reorder."""
        thr = self.thr
        forced = _forced(self.task.archetype, system, event)
        if forced == "loss":
            self.prev[system] = None
            return
        # draw(self.key, (system << 32) | event.ident), inlined: this is the hot path.
        z = (self.key + ((system << 32) | event.ident) * GOLDEN) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        h = z ^ (z >> 31)
        if (h & 0xFFFF) < thr[LOSS]:
            self.firings[LOSS] += 1
            self.prev[system] = None
            return
        h2 = 0  # a second word, drawn only when an amount or the ledger's half-commit needs it
        delayed = ((h >> 16) & 0xFFFF) < thr[DELAY]
        dup = forced == "duplicate"
        if not dup and ((h >> 32) & 0xFFFF) < thr[DUPLICATE]:
            self.firings[DUPLICATE] += 1
            dup = True
        if delayed or dup or system == LEDGER:
            h2 = mix64(h ^ _SECOND_WORD)
        arrival = event.t + LATENCY[system]
        if delayed:
            self.firings[DELAY] += 1
            arrival += 30 + (h2 & 0xFFFFFF) % 571
        partial = forced == "partial"
        if system == LEDGER and not partial and (h2 >> 48) < thr[PARTIAL]:
            self.firings[PARTIAL] += 1
            partial = True
        delivery = [arrival, event.seq, 0, event, partial]
        out = self.deliveries[system]
        out.append(delivery)
        if dup:
            out.append([arrival + 1 + ((h2 >> 24) & 0xFFFFFF) % 60, event.seq, 1, event, False])
        prev = self.prev[system]
        if (prev is not None and ((h >> 48) & 0xFFFF) < thr[REORDER]
                and prev[0] != arrival and abs(prev[0] - arrival) <= 60
                and prev[0] >= event.t):
            delivery[0], prev[0] = prev[0], arrival
            self.firings[REORDER] += 1
            delivery = None  # swapped: neither may swap again
        self.prev[system] = delivery

    # ----------------------------------------------------------------- reads
    def read(self, system: int, now: int, ordinal: int) -> dict:
        as_of = now
        if self.thr[STALE]:
            h = draw(self.key, (1 << 48) | (system << 32) | ordinal)
            if (h & 0xFFFF) < self.thr[STALE]:
                self.firings[STALE] += 1
                as_of -= 30 + ((h >> 16) & 0xFFFFFFFF) % 211
        if system == PROCESSOR and self.task.processor_lag is not None:
            as_of = max(as_of - self.task.processor_lag, STALE_PROCESSOR_FLOOR)
        self.sync(system, now)
        return _FOLDS[system](self.deliveries[system], as_of)

    def fault_firings(self) -> dict[str, int]:
        return dict(zip(FAMILIES, self.firings))


def world_firings(task: Task, seed: int, faults: FaultProfile) -> dict[str, int]:
    """The world's firings of one (task, seed): the profile faults on every delivery, to every
    system, of the canonical log as it runs to the horizon with no agent acting. A property of
    the world and the fault profile, whatever a policy reads (`fault_firings` of a record counts
    only what its policy observed). `stale_read` acts on reads, not deliveries, and a world with
    no agent has none: it is 0 here."""
    world = World(task)
    world.advance(HORIZON)
    replicas = Replicas(world, task, seed, faults)
    for system in (PROCESSOR, LEDGER, ERP, BANK):
        replicas.sync(system, HORIZON)
    return replicas.fault_firings()


_ARRIVAL_ORDER = operator.itemgetter(0, 1, 2)  # a delivery's (arrival, seq, copy), in C


def _visible(deliveries: list, as_of: int) -> list:
    vis = [d for d in deliveries if d[0] <= as_of]
    vis.sort(key=_ARRIVAL_ORDER)
    return vis


def _fold_processor(deliveries: list, as_of: int) -> dict:
    ops: dict[str, tuple] = {}
    seen = set()
    for d in _visible(deliveries, as_of):
        event = d[3]
        if event.seq in seen:
            continue  # a repeated delivery is invisible
        seen.add(event.seq)
        decline = event.attrs["decline"] if event.kind == "capture_failed" else None
        ops[event.op] = (_PROCESSOR_STATUS[event.kind], decline)
    return {"operations": [{"op": op, "status": s, "decline": dec}
                           for op, (s, dec) in sorted(ops.items(), key=lambda kv: int(kv[0][3:]))]}


def _fold_ledger(deliveries: list, as_of: int) -> dict:
    entries = []
    balance = {"cash": 0, "clearing": 0, "sales": 0}
    debits = credits = 0
    for d in _visible(deliveries, as_of):
        event = d[3]
        debit, credit = _LEDGER_LEGS[event.kind]
        amount = event.amount
        if d[4]:
            debit = None  # half-committed: only the credit leg was applied
        else:
            balance[debit] += amount
            debits += amount
        balance[credit] -= amount
        credits += amount
        entries.append({"posted": d[0], "memo": event.kind, "ref": event.op, "debit": debit,
                        "credit": credit, "amount": amount})
    balance["sales"] = -balance["sales"]
    return {"entries": entries, "balances": balance, "imbalance": debits - credits}


def _fold_erp(deliveries: list, as_of: int) -> dict:
    status = None
    seen = set()
    for d in _visible(deliveries, as_of):
        event = d[3]
        if event.seq not in seen:  # a repeated delivery of the same event is ignored
            seen.add(event.seq)
            status = _ERP_STATUS[event.kind]
    return {"status": status}


def _fold_bank(deliveries: list, as_of: int) -> dict:
    lines = []
    for d in deliveries:
        posted = (d[0] // BANK_BATCH + 1) * BANK_BATCH
        if posted <= as_of:
            event = d[3]
            sign = 1 if event.kind == "capture_settled" else -1
            lines.append((posted, d[1], d[2], sign * event.amount, _BANK_KIND[event.kind]))
    lines.sort()
    return {"lines": [{"posted": p, "amount": a, "kind": k} for p, _, _, a, k in lines]}


_FOLDS = (_fold_processor, _fold_ledger, _fold_erp, _fold_bank)
