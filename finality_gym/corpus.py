"""The corpus generator (docs/world.md section 6): nine archetypes, 321 tasks, 45 twin pairs.

A split is the same generator run from a different master seed (`public`: 1729, `regenerated`:
2718), never a hold-out of one draw. Draws come from `random.Random(master_seed)`, whose integer
methods are stable across processes and Python versions. Tasks are generated in a fixed order:
the 30 pending twin pairs, the 15 unresolvable twin pairs, then the singletons archetype by
archetype in the order of `_SINGLETONS` (docs/world.md section 6); task ids are `SSS-NNN-archetype` (SSS the split's first three letters,
so ids are unique across splits; NNN counts constructions, so both halves of a pair share it,
suffixed `a` for the settling and `b` for the failing half).

The fingerprint is the first 16 hex digits of the SHA-256 of the split's canonical JSON
(sorted keys, no whitespace) of `{"split": ..., "tasks": [...]}`.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from functools import cached_property, lru_cache

from .tasks import ORDER_VALUES, Task

SPLITS = {"public": 1729, "regenerated": 2718}

# (archetype, fate or None for the unresolvable coin, t_det range, count)
_SINGLETONS = (
    ("lost_settlement", "settle", (150, 450), 36),
    ("stale_processor", "settle", (130, 400), 36),
    ("pending_settle", "settle", (150, 540), 15),
    ("pending_fail", "fail_soft", (150, 480), 12),
    ("unresolvable", None, (620, 1500), 18),
    ("duplicate_settlement", "settle", (20, 300), 36),
    ("partial_ledger", "settle", (20, 300), 36),
    ("late_chargeback", "settle", (130, 400), 12),
    ("hard_decline", "fail_hard", (130, 450), 30),
)
PENDING_PAIRS = 30
UNRESOLVABLE_PAIRS = 15
UNRESOLVABLE_SETTLE_P = 0.75


@dataclass(frozen=True)
class Corpus:
    split: str
    fingerprint: str
    tasks: tuple[Task, ...]

    @cached_property
    def by_id(self) -> dict[str, Task]:
        return {t.task_id: t for t in self.tasks}

    def task(self, task_id: str) -> Task:
        try:
            return self.by_id[task_id]
        except KeyError:
            raise ValueError(f"no task {task_id!r} in split {self.split!r}") from None

    @cached_property
    def units(self) -> tuple[tuple[Task, ...], ...]:
        """The independent units: each twin pair together, each singleton alone."""
        pairs: dict[str, list[Task]] = {}
        out: list[list[Task]] = []
        for t in self.tasks:
            if t.twin_id is None:
                out.append([t])
            elif t.twin_id in pairs:
                pairs[t.twin_id].append(t)
            else:
                pairs[t.twin_id] = [t]
                out.append(pairs[t.twin_id])
        return tuple(tuple(u) for u in out)


def _draws(rng: random.Random, t_det_range: tuple[int, int]) -> dict:
    return {"order_value": rng.choice(ORDER_VALUES), "t_det": rng.randint(*t_det_range),
            "retry_latency": rng.randint(30, 90), "fault_key": rng.getrandbits(63)}


def generate(split: str, master_seed: int | None = None) -> tuple[Task, ...]:
    """The tasks of a split; `master_seed` overrides the split's own (a private split)."""
    if master_seed is None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        master_seed = SPLITS[split]
    rng = random.Random(master_seed)
    prefix = split[:3]
    tasks: list[Task] = []
    n = 0
    for pairs, (settle_arch, settle_fate), (fail_arch, fail_fate), t_range in (
        (PENDING_PAIRS, ("pending_settle", "settle"), ("pending_fail", "fail_soft"), (150, 480)),
        (UNRESOLVABLE_PAIRS, ("unresolvable", "settle"), ("unresolvable", "fail_hard"),
         (620, 1500)),
    ):
        for _ in range(pairs):
            d = _draws(rng, t_range)
            twin = f"{prefix}-twin-{n:03d}"
            tasks.append(Task(f"{prefix}-{n:03d}a-{settle_arch}", settle_arch, settle_fate, twin_id=twin,
                              twin_half="settle", **d))
            tasks.append(Task(f"{prefix}-{n:03d}b-{fail_arch}", fail_arch, fail_fate, twin_id=twin,
                              twin_half="fail", **d))
            n += 1
    for archetype, fate, t_range, count in _SINGLETONS:
        for _ in range(count):
            d = _draws(rng, t_range)
            if fate is None:
                fate_here = "settle" if rng.random() < UNRESOLVABLE_SETTLE_P else "fail_hard"
            else:
                fate_here = fate
            extra = {}
            if archetype == "stale_processor":
                extra["processor_lag"] = rng.randint(240, 480)
            if archetype == "late_chargeback":
                extra["chargeback_at"] = rng.randint(900, 1700)
            tasks.append(Task(f"{prefix}-{n:03d}-{archetype}", archetype, fate_here, **d, **extra))
            n += 1
    return tuple(tasks)


def canonical_json(split: str, tasks: tuple[Task, ...]) -> str:
    return json.dumps({"split": split, "tasks": [t.to_dict() for t in tasks]}, sort_keys=True,
                      separators=(",", ":"))


def fingerprint(split: str, tasks: tuple[Task, ...]) -> str:
    return hashlib.sha256(canonical_json(split, tasks).encode()).hexdigest()[:16]


PRIVATE = "private"
_private: dict[str, Corpus] = {}


def use_private(master_seed: int) -> Corpus:
    """Generate the private split of a leaderboard operator from a master seed no submitter has
    seen, and make it `load_corpus("private")` in this process. The seed is kept in memory only;
    the corpus is known by its fingerprint."""
    if type(master_seed) is not int or master_seed < 0:
        raise ValueError(f"master seed must be a non-negative int, got {master_seed!r}")
    if master_seed in SPLITS.values():
        raise ValueError("that master seed generates a published split; pick an unpublished one")
    tasks = generate(PRIVATE, master_seed)
    _private[PRIVATE] = Corpus(PRIVATE, fingerprint(PRIVATE, tasks), tasks)
    return _private[PRIVATE]


@lru_cache(maxsize=None)
def _published(split: str) -> Corpus:
    tasks = generate(split)
    return Corpus(split, fingerprint(split, tasks), tasks)


def load_corpus(split: str = "public") -> Corpus:
    """The corpus of one split, generated once per process (`private`: after `use_private`)."""
    if split == PRIVATE:
        if PRIVATE not in _private:
            raise ValueError("the private split is generated from a master seed: give "
                             "--master-seed (finality_gym.corpus.use_private)")
        return _private[PRIVATE]
    return _published(split)


def corpus_from_json(text: str) -> Corpus:
    """Rebuild a corpus from its canonical JSON, checking that it is well-formed."""
    try:
        data = json.loads(text)
        split, rows = data["split"], data["tasks"]
        tasks = tuple(Task.from_dict(row) for row in rows)
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"not a corpus JSON document: {exc}") from exc
    return Corpus(split, fingerprint(split, tasks), tasks)
