"""One episode: the agent's whole interface (the twelve tools of docs/world.md section 5) and its record.

`Episode.call(tool, **args)` returns a plain JSON-serializable dict. A malformed call (unknown
tool, unexpected or missing argument, bad key, non-positive wait) or any call after the end raises
`InvalidCall` before anything changes: not the clock, the budget, nor the log. A call that is
well-formed but refused by the world (`ship` after the deadline, a probe the arm does not allow)
returns a result with an `error` field and spends its call and ticks, as docs/world.md says of `ship`.

Probe arms (`probe=`): `full` (docs/world.md section 5); `none` (every probe refused); `delayed` (answers as of 120
ticks ago); `rate_limited` (at most 2 answered probes per episode, later ones refused);
`identity` (confirms that each capture operation exists and was submitted, never its outcome).
A refused probe costs its call and its 5 ticks. `guard=True` puts the guard (`guard.py`) in front
of the irreversible calls: one the agent's evidence does not support is refused the same way.

Choices where the rules are silent: a lapse (budget spent or horizon reached) is recorded as disposition
`close` with `lapsed=True`; `premature` counts an irreversible action (the five dispositions,
`retry_capture("fresh")`, a lapse) taken before `t_det`.
"""

from __future__ import annotations

from typing import NamedTuple, get_args, get_type_hints

from .economics import DEFAULT_COSTS, Costs, Outcome, Position, outcome_of, price
from .faults import FAMILIES, FaultProfile
from .guard import refusal
from .oracle import reference_position
from .records import check_keys
from .replicas import BANK, ERP, LEDGER, PROCESSOR, Replicas
from .tasks import CALL_BUDGET, HANDOVER_AT, HORIZON, SHIP_BY, Task
from .world import DISPOSITIONS, World

READS = ("read_processor", "read_ledger", "read_erp", "read_bank")
TOOLS = READS + ("probe_processor", "wait", "retry_capture") + DISPOSITIONS
_TOOL_NAMES = frozenset(TOOLS)  # for `check_call` at every call: a set finds a name at once
RETRY_KEYS = ("original", "fresh")
PROBE_ARMS = ("full", "none", "delayed", "rate_limited", "identity")
PROBE_DELAY = 120
PROBE_LIMIT = 2
PROBE_TICKS = 5
READ_SYSTEM = {"read_processor": PROCESSOR, "read_ledger": LEDGER, "read_erp": ERP,
                "read_bank": BANK}
_DEFAULT_FAULTS = FaultProfile()
_NO_FIRINGS = dict.fromkeys(FAMILIES, 0)


class InvalidCall(ValueError):
    """A call the interface cannot accept; raised before anything changes."""


class EpisodeRecord(NamedTuple):
    """Everything the grader needs from one episode, in integer cents and ticks. `cash`,
    `goods_left` and `escalated` are what the position is computed from, so a record can be
    re-priced under other cost constants. Immutable; a NamedTuple rather than a frozen dataclass
    because one is built per episode (a frozen dataclass of 23 fields costs 5 us to construct)."""

    task_id: str
    archetype: str
    twin_id: str | None
    twin_half: str | None
    seed: int
    probe: str
    disposition: str
    lapsed: bool
    premature: bool
    calls_used: int
    end_t: int
    order_value: int
    cash: int
    goods_left: bool
    escalated: bool
    position: int
    reference: int
    gap: int
    cogs: int
    liability: int
    dispute: int
    escalation: int
    fault_firings: dict
    tool_counts: dict

    def to_dict(self) -> dict:
        return self._asdict()

    @classmethod
    def from_dict(cls, data: dict) -> EpisodeRecord:
        """The record whose `to_dict` is `data` (the record's part of a graded row); anything
        else is refused, saying why: a key it does not have or lacks, a value not of its
        field's type (an int is not a bool here, nor a float an int), or counts that are not
        ints by name."""
        if not isinstance(data, dict):
            raise ValueError(f"an episode record is a dict (EpisodeRecord.to_dict), got {data!r}")
        check_keys(data, cls._fields, "an episode record")
        for name, kinds in _RECORD_TYPES.items():
            value = data[name]
            if type(value) not in kinds:
                names = " | ".join("None" if k is type(None) else k.__name__ for k in kinds)
                raise ValueError(f"an episode record's {name} is {names}, got {value!r}")
            if kinds == (dict,) and not all(type(k) is str and type(n) is int
                                            for k, n in value.items()):
                raise ValueError(f"an episode record's {name} counts ints by name, got {value!r}")
        return cls(**data)


# field -> the types its value may have, for `from_dict`
_RECORD_TYPES = {name: get_args(hint) or (hint,)
                 for name, hint in get_type_hints(EpisodeRecord).items()}


class Episode:
    __slots__ = ("task", "seed", "faults", "probe", "costs", "world", "now", "calls_used",
                 "done", "disposition", "lapsed", "premature", "probes_answered", "history",
                 "guard", "_replicas", "_record")

    def __init__(self, task: Task, seed: int = 0, faults: FaultProfile | None = None,
                 probe: str = "full", costs: Costs | None = None, guard: bool = False):
        if not isinstance(task, Task):
            raise TypeError(f"task must be a finality_gym Task, got {type(task).__name__}")
        if type(seed) is not int or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if faults is not None and not isinstance(faults, FaultProfile):
            raise ValueError(f"faults must be a FaultProfile or None, got {faults!r}")
        if probe not in PROBE_ARMS:
            raise ValueError(f"unknown probe arm {probe!r}; valid: {', '.join(PROBE_ARMS)}")
        if costs is not None and not isinstance(costs, Costs):
            raise ValueError(f"costs must be a Costs or None, got {costs!r}")
        self.task = task
        self.seed = seed
        self.faults = _DEFAULT_FAULTS if faults is None else faults
        self.probe = probe
        self.costs = DEFAULT_COSTS if costs is None else costs
        if type(guard) is not bool:
            raise ValueError(f"guard must be True or False, got {guard!r}")
        self.guard = guard
        self.world = World(task)
        self.now = HANDOVER_AT
        self.calls_used = 0
        self.done = False
        self.disposition: str | None = None
        self.lapsed = False
        self.premature = False
        self.probes_answered = 0
        self.history: list[tuple[int, str, dict, dict]] = []
        self._replicas: Replicas | None = None
        self._record: EpisodeRecord | None = None

    # ----------------------------------------------------------------- the call surface
    def call(self, tool: str, **args) -> dict:
        if self.done:
            raise InvalidCall(f"the episode has ended (t={self.world.ended_at}, disposition "
                              f"{self.disposition!r}); no further calls are accepted")
        ticks = check_call(tool, args)
        t = self.now
        system = READ_SYSTEM.get(tool)
        refused = self.guard and refusal(tool, args, self.history, t, self.calls_used,
                                         PROBE_DELAY if self.probe == "delayed" else 0)
        if refused:
            result = {"error": refused}
        elif system is not None:
            self.world.advance(t)
            if self._replicas is None:
                self._replicas = Replicas(self.world, self.task, self.seed, self.faults)
            result = self._replicas.read(system, t, self.calls_used)
        elif tool == "wait":
            ticks = min(ticks, HORIZON - t)
            result = {"ticks": ticks}
        elif tool == "probe_processor":
            result = self._probe(t)
        elif tool == "retry_capture":
            key = args["key"]
            if key == "fresh" and t < self.task.t_det:
                self.premature = True
            self.world.retry(key, t)
            result = {"key": key, "ack": "accepted"}
        elif tool == "ship" and t > SHIP_BY:
            result = {"error": f"ship refused: the ship-by deadline (t={SHIP_BY}) has passed and "
                               "the customer has cancelled"}
        else:
            result = {"ok": True}
            self._end(tool, t, lapsed=False)
        result["tool"] = tool
        result["t"] = t
        self.calls_used += 1
        self.history.append((t, tool, args, result))
        self.now = t + ticks if t + ticks < HORIZON else HORIZON
        if not self.done and (self.calls_used >= CALL_BUDGET or self.now >= HORIZON):
            self._end("close", self.now, lapsed=True)
        return result

    def lapse(self) -> None:
        """End the case now as a lapse (`close` at the current time, `lapsed=True`): how a
        harness ends an agent that stopped acting, for example a model past its caps."""
        if self.done:
            raise InvalidCall("the episode has ended; it cannot lapse")
        self._end("close", self.now, lapsed=True)

    def _probe(self, t: int) -> dict:
        arm = self.probe
        if arm == "none":
            return {"error": "probe refused: no finality source in this arm"}
        if arm == "rate_limited" and self.probes_answered >= PROBE_LIMIT:
            return {"error": f"probe refused: at most {PROBE_LIMIT} probes per episode"}
        self.probes_answered += 1
        if arm == "identity":
            return {"captures": {op: "submitted" for op in self.world.operations(t)}}
        return {"captures": self.world.probe(t - PROBE_DELAY if arm == "delayed" else t)}

    def _end(self, disposition: str, t: int, lapsed: bool) -> None:
        if t < self.task.t_det:
            self.premature = True
        self.world.dispose(disposition, t)
        self.done = True
        self.disposition = disposition
        self.lapsed = lapsed

    # ----------------------------------------------------------------- the record
    def tool_counts(self) -> dict:
        """How many times each tool was called, in order of first use."""
        counts: dict[str, int] = {}
        for _, tool, _, _ in self.history:
            counts[tool] = counts.get(tool, 0) + 1
        return counts

    def record(self) -> EpisodeRecord:
        if not self.done:
            raise InvalidCall("the episode is still running; record() is available once it ends")
        if self._record is None:
            task = self.task
            outcome, position, reference = self._priced()
            self._record = EpisodeRecord(
                task.task_id, task.archetype, task.twin_id, task.twin_half, self.seed, self.probe,
                self.disposition, self.lapsed, self.premature, self.calls_used,
                self.world.ended_at, task.order_value, outcome.cash, outcome.goods_left,
                outcome.escalated, position.total, reference, reference - position.total,
                position.cogs, position.liability, position.dispute, position.escalation,
                _NO_FIRINGS.copy() if self._replicas is None else self._replicas.fault_firings(),
                self.tool_counts())
        return self._record


    def gap(self) -> int:
        """The ended episode's gap in cents, as its record has it, without building the record:
        the env needs the gap at every episode's end, and the record costs three times as much."""
        if not self.done:
            raise InvalidCall("the episode is still running; gap() is available once it ends")
        _, position, reference = self._priced()
        return reference - position.total

    def _priced(self) -> tuple[Outcome, Position, int]:
        """What the episode's log is worth: its outcome, that priced, and the reference's
        position (the gap is the difference of the last two)."""
        outcome = outcome_of(self.world.log, self.task.order_value)
        return outcome, price(outcome, self.costs), reference_position(self.task, self.costs)


def compact_calls(history: list) -> list[list]:
    """An episode's calls as the grader records them: `[t, tool]`, or `[t, tool, value]` for
    the one argument of `wait` (ticks) and `retry_capture` (key). With the task, the seed, the
    probe arm, the fault profile and the costs they determine the whole episode (`replay`)."""
    return [[t, tool, *args.values()] if args else [t, tool] for t, tool, args, _ in history]


_ARGUMENT = {"wait": "ticks", "retry_capture": "key"}


def replay(task: Task, seed: int, calls: list, lapsed: bool, faults: FaultProfile | None = None,
           probe: str = "full", costs: Costs | None = None, guard: bool = False) -> Episode:
    """The ended episode that a policy played, rebuilt by the engine from its recorded calls
    (`compact_calls`), without the policy: every call is made again at the time recorded, and an
    episode that lapsed without running out of calls or time (a harness ended it) is lapsed at
    its last time. Raises ValueError naming the first call that does not replay (a record of
    another task, seed or world)."""
    episode = Episode(task, seed=seed, faults=faults, probe=probe, costs=costs, guard=guard)
    for number, call in enumerate(calls):
        if (not isinstance(call, list) or len(call) not in (2, 3) or type(call[0]) is not int
                or call[1] not in TOOLS or (len(call) == 3) != (call[1] in _ARGUMENT)):
            raise ValueError(f"call {number} is not a recorded call: {call!r}")
        if episode.done or episode.now != call[0]:
            raise ValueError(f"call {number} ({call[1]} at t={call[0]}) does not replay: the "
                             f"episode is {'over' if episode.done else f'at t={episode.now}'}")
        try:
            episode.call(call[1], **({_ARGUMENT[call[1]]: call[2]} if len(call) == 3 else {}))
        except InvalidCall as exc:
            raise ValueError(f"call {number} does not replay: {exc}") from None
    if not episode.done:
        if not lapsed:
            raise ValueError(f"the {len(calls)} calls recorded do not end the episode")
        episode.lapse()
    return episode


def check_call(tool: str, args: dict) -> int:
    """Check one call's shape; return its cost in ticks (a wait's requested ticks). Raises
    `InvalidCall` naming the problem. The tool table shown to agents (`tools.py`) agrees with it."""
    if tool == "wait":
        if set(args) != {"ticks"}:
            raise InvalidCall(f"wait takes exactly one argument 'ticks', got {sorted(args)}")
        ticks = args["ticks"]
        if type(ticks) is not int or ticks < 1:
            raise InvalidCall(f"wait: ticks must be an int >= 1, got {ticks!r}")
        return ticks
    if tool == "retry_capture":
        if set(args) != {"key"}:
            raise InvalidCall(f"retry_capture takes exactly one argument 'key', got {sorted(args)}")
        if args["key"] not in RETRY_KEYS:
            raise InvalidCall(f"retry_capture: key must be one of {RETRY_KEYS}, got {args['key']!r}")
        return 1
    if tool not in _TOOL_NAMES:
        raise InvalidCall(f"unknown tool {tool!r}; valid tools: {', '.join(TOOLS)}")
    if args:
        raise InvalidCall(f"{tool} takes no arguments, got {sorted(args)}")
    return PROBE_TICKS if tool == "probe_processor" else 1
