"""The one check of a dict read back into a record (a run.json's costs or faults, a graded row's
episode, a corpus file's task): its keys are the record's, or it is refused, naming the keys it
has that the record lacks and those it lacks, rather than read as some other record."""

from __future__ import annotations

from typing import Iterable


def check_keys(data: dict, keys: Iterable[str], what: str, optional: Iterable[str] = ()) -> None:
    """Raise ValueError unless `data`'s keys are `keys`, those of `optional` (fields with a
    default) allowed to be missing. `what` names the record in the message (`a task`)."""
    keys, optional = set(keys), set(optional)
    unknown, missing = set(data) - keys, keys - optional - set(data)
    if unknown or missing:
        raise ValueError(f"not {what}: unknown keys {sorted(unknown)}, missing keys "
                         f"{sorted(missing)}")
