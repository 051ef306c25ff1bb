"""What both imports of a self-reported run check alike: `python -m eval import-inspect`
(`eval/models/import_inspect.py`, an inspect log) and `python -m eval import-verifiers`
(`eval/models/import_verifiers.py`, a vf-eval run). Each import's own checks (the shapes of its
log, the cases it declares) are in its own module; here are the rules they share.

- **Values are compared as JSON** (`same`, `differing`, and `check_row`, a logged row against
  its replay's): a logged value equals a derived one
  only if their canonical JSON texts (`json.dumps(..., sort_keys=True)`) are equal, so `false`
  is not `0` and `120.0` is not `120` (Python's `==` says they are, and a row so edited would be
  sealed as it was logged, then fail the readers of the results folder).
- **One endpoint, one context window** (`Requests`, `check_overflows`): a model behind one
  endpoint has one context window, so a claimed context overflow (a lapse: the case ended
  because a request did not fit) on a request shorter than one the same run's endpoint
  answered (any case's) is refused: it is a conversation cut short and relabelled. A request's
  length is `request_size`: the characters of the JSON of its messages as the model arm sends
  them (non-ASCII characters counted once each), every request of a run carrying the same tools
  and sampling fields. Characters are not the model's tokens: a genuine run whose window fell
  within the few tokens by which two requests' tokens-per-character differ (a ragged boundary)
  is refused too, with a message saying so: run it again with a larger window.

May import: the standard library and `finality_gym` (the record's fields).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from finality_gym.episode import EpisodeRecord

RECORD_FIELDS = frozenset(EpisodeRecord._fields)


def canonical(value) -> str:
    """A value's canonical JSON text: keys sorted, a bool never an int, a float never an int."""
    return json.dumps(value, sort_keys=True)


def same(logged, derived) -> bool:
    return canonical(logged) == canonical(derived)


def differing(derived: dict, row: dict) -> list[str]:
    """The keys of either row whose values are not the same JSON (a key one lacks is None)."""
    return sorted(k for k in derived.keys() | row.keys() if not same(derived.get(k), row.get(k)))


def first_difference(logged: list, derived: list) -> int:
    """The index of the first item of two lists that is not the same JSON (the shorter one's
    length if it is the other's beginning)."""
    return next((i for i, (a, b) in enumerate(zip(logged, derived)) if not same(a, b)),
                min(len(logged), len(derived)))


def short(value, limit: int = 100) -> str:
    """A logged value as a refusal quotes it: its JSON, cut at `limit` characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def check_row(derived: dict, row: dict, source: str) -> None:
    """A logged graded row against the row its conversation replays to (`source`: `log` or
    `run`, for the message): its calls first (naming the first that differs), then its record,
    then the rest; ValueError saying which."""
    if not same(derived["calls"], row.get("calls")):
        calls = row.get("calls") if isinstance(row.get("calls"), list) else []
        at = first_difference(calls, derived["calls"])
        said = [short(c[at]) if at < len(c) else "nothing" for c in (calls, derived["calls"])]
        raise ValueError(f"its row's calls are not the tool calls of its conversation "
                         f"({len(calls)} calls in the row, {len(derived['calls'])} in the "
                         f"conversation; call {at}: the row has {said[0]}, the conversation "
                         f"{said[1]})")
    differ = differing(derived, row)
    record = [k for k in differ if k in RECORD_FIELDS]
    if record:
        raise ValueError(f"its row does not replay to its record ({', '.join(record)} differ): "
                         f"the {source} was edited or is not this engine's")
    if differ:
        raise ValueError(f"its row is not what its conversation gives ("
                         f"{', '.join(map(short, differ))} differ)")


def request_size(messages: list[dict]) -> int:
    """A request's length: the characters of the JSON of its messages (the arm's dicts)."""
    return len(json.dumps(messages, ensure_ascii=False))


@dataclass
class Requests:
    """One replayed case's requests by `request_size`: the longest one its endpoint answered
    (0 if none), and the one a claimed context overflow failed (None if none did)."""

    answered: int = 0
    overflow: int | None = None

    def asked(self, messages: list[dict], overflowed: bool) -> None:
        size = request_size(messages)
        if overflowed:
            self.overflow = size
        else:
            self.answered = max(self.answered, size)


def check_overflows(cases: list[tuple[str, Requests]]) -> None:
    """Refuse a claimed context overflow on a request shorter than one the run's endpoint
    answered (see the module's docstring); `cases`: (where, its requests) for every case of one
    run. ValueError naming the case and the longer answered request's."""
    answered = [(r.answered, where) for where, r in cases if r.answered]
    if not answered:
        return
    longest, at = max(answered, key=lambda a: a[0])
    for where, requests in cases:
        if requests.overflow is not None and requests.overflow < longest:
            raise ValueError(
                f"{where}: it claims a context overflow on a request of {requests.overflow:,} "
                f"characters, shorter than one its run's endpoint answered ({longest:,} "
                f"characters, {at}): one model behind one endpoint has one context window, so "
                "the conversation was cut short and relabelled, or the run's overflow boundary "
                "is ragged (a genuine run whose window fell within a few tokens of its longest "
                "requests): run it again with a larger context window")
