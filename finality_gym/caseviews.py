"""What a frame of the timeline may know of a case, in two views.

`public_view` reads only what the agent was told (the order value, the probe arm, the clock, the
calls and their results); `truth_view` exists only for an ended episode: the canonical log,
`t_det`, the record and the fault marks are all ground truth. Drawing from these two alone is
what keeps a running case's frame free of the truth (`timeline`).

`fault_marks` finds what the episode's fault profile did to each delivery and read, by replaying
its replicas; `FAULT_WORDS` names each family's effect in the picture.
"""

from __future__ import annotations

from typing import NamedTuple

from .episode import READ_SYSTEM
from .faults import FAMILIES, FaultProfile
from .replicas import BANK_BATCH, Replicas

# what a fault did to the delivery or read it marks, by family: the word its label starts with
FAULT_WORDS = {"loss": "lost", "delay": "delayed", "duplicate": "duplicated",
               "partial_commit": "half-committed", "reorder": "reordered",
               "stale_read": "stale read"}
assert tuple(FAULT_WORDS) == FAMILIES


class PublicView(NamedTuple):
    """Only what the agent was told: the brief's order value and probe arm, the clock, the calls
    and their results."""

    order_value: int
    probe: str
    now: int
    calls_used: int
    history: tuple


class FaultMark(NamedTuple):
    """One delivery or read a profile fault changed, for the track of the system `tool` reads.
    `t` is when the system would have shown the delivery (a bank line: when it would have
    posted) or the read's time; `moved_to`, for a delayed or reordered delivery, when it showed
    instead; `what` the event delivered ("" for a read)."""

    tool: str
    family: str
    t: int
    moved_to: int | None
    what: str


class TruthView(NamedTuple):
    """Only for an ended case: the canonical log, t_det, the episode's record and the faults."""

    log: tuple
    t_det: int
    rec: object  # finality_gym.EpisodeRecord
    faults: tuple  # FaultMark, in time order


def public_view(episode) -> PublicView:
    return PublicView(episode.task.order_value, episode.probe, episode.now, episode.calls_used,
                      tuple(episode.history))


def truth_view(episode) -> TruthView | None:
    if not episode.done:
        return None
    return TruthView(tuple(episode.world.log), episode.task.t_det, episode.record(),
                     fault_marks(episode))


def fault_marks(episode) -> tuple[FaultMark, ...]:
    """The deliveries and reads the episode's fault profile changed, in time order: exactly the
    firings its record's `fault_firings` counts (a reorder swaps two deliveries: two marks).

    Found by replaying the replicas of the ended episode (every draw is a pure function of the
    episode key and an identity, docs/world.md section 4) three times and comparing: under the
    episode's profile, its reads in their order (so each stale read shows as a firing); without
    `reorder` (the arrivals before any swap); and with no profile fault (what the world and the
    case's own archetype faults deliver, which are not marked). Each system's deliveries are
    built up to the agent's last read of it, as the episode built them. Only for an ended
    episode: what a fault did is ground truth."""
    if not episode.done:
        raise ValueError("fault marks are ground truth: only for an ended episode")
    world, task, seed, profile = episode.world, episode.task, episode.seed, episode.faults
    actual = Replicas(world, task, seed, profile)
    unswapped = Replicas(world, task, seed, profile.without("reorder"))
    clean = Replicas(world, task, seed, FaultProfile.none())
    marks = []
    last_read: dict[str, int] = {}
    for ordinal, (t, tool, _, _) in enumerate(episode.history):
        if tool in READ_SYSTEM:
            stale = actual.fault_firings()["stale_read"]
            actual.read(READ_SYSTEM[tool], t, ordinal)
            if actual.fault_firings()["stale_read"] > stale:
                marks.append(FaultMark(tool, "stale_read", t, None, ""))
            last_read[tool] = t
    for tool, t in last_read.items():
        system = READ_SYSTEM[tool]
        unswapped.sync(system, t)
        clean.sync(system, t)
        marks += _delivery_faults(tool, *(_by_copy(r.deliveries[system])
                                          for r in (actual, unswapped, clean)))
    return tuple(sorted(marks, key=lambda m: (m.t, m.tool, m.family)))


def _by_copy(deliveries: list) -> dict:
    """A system's deliveries by (event seq, copy)."""
    return {(d[1], d[2]): d for d in deliveries}


def _delivery_faults(tool: str, actual: dict, unswapped: dict, clean: dict) -> list[FaultMark]:
    """What the profile changed among one system's deliveries (`_by_copy` of each replay)."""
    shown = ((lambda arrival: (arrival // BANK_BATCH + 1) * BANK_BATCH) if tool == "read_bank"
             else (lambda arrival: arrival))
    marks = []
    for key, d in clean.items():
        what = _delivered(d[3])
        if key[1] == 0 and key not in actual:
            marks.append(FaultMark(tool, "loss", shown(d[0]), None, what))
        elif key[1] == 0 and unswapped[key][0] != d[0]:
            marks.append(FaultMark(tool, "delay", shown(d[0]), shown(unswapped[key][0]), what))
    for key, d in actual.items():
        what = _delivered(d[3])
        if key not in clean:
            marks.append(FaultMark(tool, "duplicate", shown(d[0]), None, what))
        elif d[4] and not clean[key][4]:
            marks.append(FaultMark(tool, "partial_commit", shown(d[0]), None, what))
        if key[1] == 0 and d[0] != unswapped[key][0]:
            marks.append(FaultMark(tool, "reorder", shown(unswapped[key][0]), shown(d[0]), what))
    return marks


_DELIVERED = {"order_placed": "order placed", "authorized": "authorized", "shipped": "shipped",
              "capture_submitted": "submitted", "capture_settled": "settled",
              "capture_failed": "declined", "refunded": "refunded", "capture_voided": "voided",
              "chargeback": "chargeback"}


def _delivered(event) -> str:
    """An event as a fault's label names it: the operation (and attempt) and what happened."""
    if event.op is None:
        return _DELIVERED[event.kind]
    attempt = (event.attrs or {}).get("attempt", 1)
    return f"{event.op if attempt == 1 else f'{event.op} #{attempt}'} {_DELIVERED[event.kind]}"
