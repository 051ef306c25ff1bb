"""The corpus generator (docs/world.md section 6): nine archetypes, 321 tasks, 45 twin pairs.

A split is the same generator run from a different master seed (`public`: 1729, `regenerated`:
2718), never a hold-out of one draw. Draws come from `random.Random(master_seed)`, whose integer
methods are stable across processes and Python versions. Tasks are generated in a fixed order:
the 30 pending twin pairs, the 15 unresolvable twin pairs, then the singletons archetype by
archetype in the order of `_SINGLETONS` (docs/world.md section 6); task ids are `SSS-NNN-archetype` (SSS the split's first three letters,
so ids are unique across splits; NNN counts constructions, so both halves of a pair share it,
suffixed `a` for the settling and `b` for the failing half).

The private split (`private_corpus`) is generated from a leaderboard operator's secret master seed,
which must lie in [2**127, 2**256) (`check_master_seed`; `new_master_seed` draws 128 random
bits): a smaller one could be found by trying seeds until one reproduces the published
fingerprint. Its ids are opaque: `pri-` and 12 hex digits of an HMAC-SHA256 keyed by the master
seed (twin ids `pri-twin-` and 12 more), so they name no archetype, no half, and their sorted
order says nothing of the order of generation; the halves of a pair still share a twin id.

The fingerprint is the first 16 hex digits of the SHA-256 of the split's canonical JSON
(sorted keys, no whitespace) of `{"split": ..., "tasks": [...]}`.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import random
import secrets
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

from .tasks import ORDER_VALUES, Task

SPLITS = {"public": 1729, "regenerated": 2718}
PRIVATE = "private"  # generated from a leaderboard operator's master seed (`private_corpus`)

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
    """The tasks of a split; `master_seed` overrides the split's own (a private split, which
    needs a master seed that passes `check_master_seed`, and gets opaque ids)."""
    if master_seed is None:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        master_seed = SPLITS[split]
    if split == PRIVATE:
        master_seed = check_master_seed(master_seed)
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
    if split == PRIVATE:
        return _opaque_ids(tasks, master_seed)
    return tuple(tasks)


# The private split's master seed: at least 2**127 (so at least 128 bits long: no seed a person
# types, a date, a counter or a 64-bit value passes) and below 2**256 (the HMAC key's 32 bytes).
MASTER_SEED_MIN = 1 << 127
MASTER_SEED_LIMIT = 1 << 256
KEYGEN = "python -m eval keygen --out FILE"


def new_master_seed() -> int:
    """A master seed for a private split: 128 random bits from `secrets`, above a set bit 128
    (so it always passes `check_master_seed`, whatever the draw)."""
    return (1 << 128) | secrets.randbits(128)


def check_master_seed(master_seed: object) -> int:
    """`master_seed` if it may seed a private split, else a ValueError that never shows it.

    The rule: an int with 2**127 <= seed < 2**256. The fingerprint of a private split is
    published and every task follows from the seed, so a seed small enough to enumerate can be
    found offline by regenerating candidates until one matches the fingerprint (4242 took
    seconds); 128 random bits cannot be."""
    if type(master_seed) is not int:
        raise ValueError(f"the master seed must be an int, not {type(master_seed).__name__}")
    if not MASTER_SEED_MIN <= master_seed < MASTER_SEED_LIMIT:
        low = master_seed < MASTER_SEED_MIN
        raise ValueError(
            f"the master seed is {'too small to be secret' if low else 'too large'}: it must "
            "lie in [2**127, 2**256), so that it cannot be found by trying seeds against the "
            f"published fingerprint; make one with 128 random bits: `{KEYGEN}`, then grade "
            "with --master-seed-file FILE")
    return master_seed


def _opaque_ids(tasks: list[Task], master_seed: int) -> tuple[Task, ...]:
    """The private split's tasks under ids keyed by its master seed: `pri-` + 12 hex digits of
    HMAC-SHA256(seed, the task's place in the order of generation); twin ids `pri-twin-` + 12
    hex digits of HMAC-SHA256(seed, the pair's twin id). Stable for a seed; without it they say
    nothing (not the archetype, the half, or the place). Collisions (odds about 2**-32 a seed)
    are settled by hashing again, so ids stay unique."""
    key = master_seed.to_bytes(32, "big")
    taken: set[str] = set()

    def opaque(prefix: str, label: str) -> str:
        for attempt in itertools.count():
            digest = hmac.new(key, f"finality-gym {label} {attempt}".encode(),
                              hashlib.sha256).hexdigest()
            name = f"{prefix}{digest[:12]}"
            if name not in taken:
                taken.add(name)
                return name
        raise AssertionError("unreachable")

    twins: dict[str, str] = {}
    out = []
    for i, t in enumerate(tasks):
        changed = {"task_id": opaque(f"{PRIVATE[:3]}-", f"task {i}")}
        if t.twin_id is not None:
            if t.twin_id not in twins:
                twins[t.twin_id] = opaque(f"{PRIVATE[:3]}-twin-", f"twin {t.twin_id}")
            changed["twin_id"] = twins[t.twin_id]
        out.append(replace(t, **changed))
    return tuple(out)


def canonical_json(split: str, tasks: tuple[Task, ...]) -> str:
    return json.dumps({"split": split, "tasks": [t.to_dict() for t in tasks]}, sort_keys=True,
                      separators=(",", ":"))


def fingerprint(split: str, tasks: tuple[Task, ...]) -> str:
    return hashlib.sha256(canonical_json(split, tasks).encode()).hexdigest()[:16]


@lru_cache(maxsize=2)
def private_corpus(master_seed: int) -> Corpus:
    """The private split of a leaderboard operator, generated from a master seed no submitter
    has seen; the caller holds the seed and passes it here each time (nothing in the process
    becomes the private split: `load_corpus("private")` refuses). The seed stays in memory; the
    corpus is known by its fingerprint. The seed must pass `check_master_seed` (which also keeps
    out the published splits' seeds)."""
    tasks = generate(PRIVATE, check_master_seed(master_seed))
    return Corpus(PRIVATE, fingerprint(PRIVATE, tasks), tasks)


@lru_cache(maxsize=None)
def _published(split: str) -> Corpus:
    tasks = generate(split)
    return Corpus(split, fingerprint(split, tasks), tasks)


def load_corpus(split: str = "public") -> Corpus:
    """The corpus of a published split, generated once per process; the private split is made
    from its master seed by `private_corpus`."""
    if split == PRIVATE:
        raise ValueError("the private split is generated from a master seed: give "
                         "--master-seed-file (finality_gym.corpus.private_corpus)")
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
