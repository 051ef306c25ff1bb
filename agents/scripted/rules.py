"""The scripted policies of docs/world.md section 9 and the floors a submission must beat.

Each `plan` reads top to bottom like the operating rule it encodes. Every polling policy checks,
before a wait or a retry, that the next round (its reads, the wait, a final disposition) still
fits in the remaining calls and before the deadline; if not, it refunds now, as it would at the
deadline. The reference oracle is the one class with `privileged = True`.

Choices where the rules are silent: `majority_vote`'s majority is a plurality of the four verdicts,
any tie between the leaders reading as pending; `react` goes straight on to the next system after
a keyed retry; `reflection` re-checks only verdict-driven dispositions (a deadline refund is taken
at once) and, when the second read disagrees, reads the next system at once; `finality_gate`
treats a refused or identity-only probe answer as `unknown`; `do_nothing` waits in one call to
the horizon.
"""

from __future__ import annotations

import random
from typing import Generator

from finality_gym.oracle import oracle_plan

from . import verdicts as v
from finality_gym.policy import Call, Policy, Privilege

Plan = Generator[Call, dict, None]
READ = {name: (name, {}) for name in v.ROTATION}
PROBE: Call = ("probe_processor", {})
SHIP: Call = ("ship", {})
REFUND: Call = ("refund", {})
CLOSE: Call = ("close", {})
ESCALATE: Call = ("escalate", {})
RETRY_ORIGINAL: Call = ("retry_capture", {"key": "original"})
RETRY_FRESH: Call = ("retry_capture", {"key": "fresh"})


def wait(ticks: int) -> Call:
    return ("wait", {"ticks": ticks})


class RandomPolicy(Policy):
    name = "random"
    TOOLS = ("read_processor", "read_ledger", "read_erp", "read_bank", "probe_processor", "wait",
             "retry_capture", "ship", "refund", "write_off", "escalate", "close")

    def plan(self) -> Plan:
        rng = random.Random(self.brief.seed)
        while True:
            tool = rng.choice(self.TOOLS)
            if tool == "wait":
                yield wait(rng.choice((10, 30, 60, 120)))
            elif tool == "retry_capture":
                yield ("retry_capture", {"key": rng.choice(("original", "fresh"))})
            else:
                yield (tool, {})


class Optimistic(Policy):
    """Believes the ledger: the submission's clearing entry or any cash means paid."""

    name = "optimistic"

    def plan(self) -> Plan:
        while True:
            balances = (yield READ["read_ledger"])["balances"]
            if balances["clearing"] > 0 or balances["cash"] > 0:
                yield SHIP
                return
            if not self.fits(calls=3, ticks=30 + 1):
                yield REFUND
                return
            yield wait(30)


class Eager(Policy):
    """Reads the processor once and commits; a pending capture is captured again, fresh."""

    name = "eager"

    def plan(self) -> Plan:
        verdict = v.processor((yield READ["read_processor"]))
        if verdict == v.SETTLED:
            yield SHIP
        elif verdict in (v.FAILED_SOFT, v.FAILED_HARD):
            yield CLOSE
        else:
            yield RETRY_FRESH
            yield SHIP


class MajorityVote(Policy):
    name = "majority_vote"

    def plan(self) -> Plan:
        ov = self.brief.order_value
        while True:
            results = {}
            for read in v.ROTATION:
                results[read] = yield READ[read]
            if (results["read_ledger"]["balances"]["cash"] > ov
                    or v.bank_credits(results["read_bank"]) > ov):
                yield ESCALATE
                return
            verdict = _plurality([v.BY_READ[r](res) for r, res in results.items()])
            if verdict == v.SETTLED:
                yield SHIP
                return
            if verdict == v.FAILED_SOFT:
                yield REFUND
                return
            if not self.fits(calls=6, ticks=60 + 4):
                yield REFUND
                return
            yield wait(60)


def _plurality(verdicts: list[str]) -> str:
    """Failures of either kind vote together; a tie between the leaders is pending."""
    votes = {}
    for verdict in verdicts:
        key = v.FAILED_SOFT if verdict == v.FAILED_HARD else verdict
        votes[key] = votes.get(key, 0) + 1
    best = max(votes.values())
    leaders = [k for k, n in votes.items() if n == best]
    return leaders[0] if len(leaders) == 1 else v.PENDING


class SOP(Policy):
    """A standard operating procedure with two knobs."""

    name = "sop"

    def __init__(self, poll_interval: int = 60, max_polls: int = 4):
        if type(poll_interval) is not int or poll_interval < 1:
            raise ValueError(f"sop: poll_interval must be an int >= 1, got {poll_interval!r}")
        if type(max_polls) is not int or max_polls < 1:
            raise ValueError(f"sop: max_polls must be an int >= 1, got {max_polls!r}")
        self.poll_interval = poll_interval
        self.max_polls = max_polls
        if (poll_interval, max_polls) != (60, 4):
            self.name = f"sop:poll_interval={poll_interval},max_polls={max_polls}"

    def plan(self) -> Plan:
        poll = self.poll_interval
        retried = False
        pending_polls = 0
        while True:
            verdict = v.processor((yield READ["read_processor"]))
            if verdict == v.SETTLED:
                yield SHIP
                return
            if verdict == v.FAILED_HARD:
                yield CLOSE
                return
            if verdict == v.FAILED_SOFT and not retried:
                if not self.fits(calls=5, ticks=1 + poll + 2):
                    yield REFUND
                    return
                retried = True
                yield RETRY_ORIGINAL
                yield wait(poll)  # this poll is not counted
                continue
            if v.bank((yield READ["read_bank"])) == v.SETTLED:
                yield SHIP
                return
            pending_polls += 1
            if pending_polls >= self.max_polls:
                yield ESCALATE
                return
            if not self.fits(calls=4, ticks=poll + 2):
                yield REFUND
                return
            yield wait(poll)


class ReAct(Policy):
    """Observe the next system in rotation, decide from that observation alone."""

    name = "react"
    reflect = False

    def plan(self) -> Plan:
        turn = 0
        while True:
            read = v.ROTATION[turn % 4]
            turn += 1
            verdict = v.BY_READ[read]((yield READ[read]))
            if verdict in (v.SETTLED, v.FAILED_HARD):
                if self.reflect:
                    if not self.fits(calls=3, ticks=10 + 1):
                        yield REFUND
                        return
                    yield wait(10)
                    if v.BY_READ[read]((yield READ[read])) != verdict:
                        continue
                yield SHIP if verdict == v.SETTLED else CLOSE
                return
            if verdict == v.FAILED_SOFT:
                if not self.fits(calls=3, ticks=2):
                    yield REFUND
                    return
                yield RETRY_ORIGINAL
                continue
            if not self.fits(calls=3, ticks=30 + 1):
                yield REFUND
                return
            yield wait(30)


class Reflection(ReAct):
    """ReAct that, before an irreversible action, waits 10 and re-reads the same system."""

    name = "reflection"
    reflect = True


class FinalityGate(Policy):
    """No irreversible action until the authoritative probe returns a terminal status."""

    name = "finality_gate"

    def plan(self) -> Plan:
        while True:
            answer = (yield PROBE).get("captures", {}).get("cap1", "unknown")
            if answer == "settled":
                yield SHIP
                return
            if answer == "failed_hard":
                yield CLOSE
                return
            if answer == "failed_soft":
                if not self.fits(calls=3, ticks=1 + 5):
                    yield REFUND
                    return
                yield RETRY_ORIGINAL
                continue
            ticks = min(60, self.brief.ship_by - self.now - 10)
            if ticks < 1 or not self.fits(calls=3, ticks=ticks + 5):
                yield REFUND
                return
            yield wait(ticks)


class FinalityOracle(Policy):
    """The reference (docs/world.md section 8): acts at its first call on the fate it is told."""

    name = "finality_oracle"
    privileged = True

    def reset(self, brief) -> None:
        super().reset(brief)
        self._privilege: Privilege | None = None

    def grant(self, privilege: Privilege) -> None:
        self._privilege = privilege

    def plan(self) -> Plan:
        if self._privilege is None:
            raise PermissionError("finality_oracle needs its Privilege before its first call")
        for call in oracle_plan(self._privilege.fate):
            yield call


class _Floor(Policy):
    call: Call = CLOSE

    def plan(self) -> Plan:
        yield self.call


class AlwaysShip(_Floor):
    name, call = "always_ship", SHIP


class AlwaysRefund(_Floor):
    name, call = "always_refund", REFUND


class AlwaysEscalate(_Floor):
    name, call = "always_escalate", ESCALATE


class DoNothing(Policy):
    name = "do_nothing"

    def plan(self) -> Plan:
        while True:
            yield wait(max(1, self.brief.horizon - self.now))


class OpenLoopPlan(Policy):
    """A fixed plan (docs/world.md section 11's reference check): wait w1, optionally `retry_capture`
    under one key, wait w2, one terminal action. A wait of 0 is no call. If the terminal action
    is refused (`ship` after the deadline) the case is left to lapse at the horizon."""

    RETRIES = ("none", "original", "fresh")
    TERMINALS = ("ship", "refund", "write_off", "escalate", "close")

    def __init__(self, w1: int, retry: str, w2: int, terminal: str):
        if type(w1) is not int or type(w2) is not int or w1 < 0 or w2 < 0:
            raise ValueError(f"plan: waits must be non-negative ints, got {w1!r}, {w2!r}")
        if retry not in self.RETRIES:
            raise ValueError(f"plan: retry must be one of {self.RETRIES}, got {retry!r}")
        if terminal not in self.TERMINALS:
            raise ValueError(f"plan: terminal must be one of {self.TERMINALS}, got {terminal!r}")
        self.w1, self.retry, self.w2, self.terminal = w1, retry, w2, terminal
        self.name = f"plan:{w1},{retry},{w2},{terminal}"

    def plan(self) -> Plan:
        if self.w1:
            yield wait(self.w1)
        if self.retry != "none":
            yield ("retry_capture", {"key": self.retry})
        if self.w2:
            yield wait(self.w2)
        yield (self.terminal, {})
        while True:
            yield wait(max(1, self.brief.horizon - self.now))
