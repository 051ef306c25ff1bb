"""Fault profiles and the counter-based draws behind them (docs/world.md section 4).

Every draw is a pure function of (episode key, domain, identity): the episode key mixes the task's
fault key with the episode seed; a delivery's identity is (system, canonical event identity, copy)
and a read's is (system, ordinal of the call). Nothing depends on the order in which draws are
made, so the two halves of a twin pair draw identical faults for their shared events, and every
process reproduces every episode.

The mixer is SplitMix64's finaliser over `key + index * golden`, i.e. the SplitMix64 stream of the
key read at a computed position; its 64 output bits are cut into 16-bit uniforms (compared with
`round(p * 65536)`) and wider fields for the amounts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from .records import check_keys

FAMILIES = ("loss", "delay", "duplicate", "partial_commit", "reorder", "stale_read")
DEFAULT_INTENSITY = 0.30

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z: int) -> int:
    """SplitMix64's output function: a bijection on 64-bit integers with full avalanche."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


@lru_cache(maxsize=1 << 16)
def episode_key(fault_key: int, seed: int) -> int:
    """The key of one episode's draws: the task's fault key together with the episode seed."""
    return mix64((fault_key ^ mix64((seed * GOLDEN) & MASK64)) & MASK64)


def draw(key: int, identity: int) -> int:
    """64 uniform bits for one identity under one episode key."""
    return mix64((key + identity * GOLDEN) & MASK64)


@dataclass(frozen=True, slots=True)
class FaultProfile:
    """An intensity `p` and the enabled families; each enabled family fires with probability `p`
    per opportunity. The default is the standard world (docs/world.md section 4): all six families at 0.30."""

    intensity: float = DEFAULT_INTENSITY
    families: frozenset[str] = frozenset(FAMILIES)
    # Per family (in FAMILIES order), the 16-bit threshold a uniform must fall below to fire.
    thresholds: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.intensity, bool) or not isinstance(self.intensity, (int, float)):
            raise ValueError(f"intensity must be a number in [0, 1], got {self.intensity!r}")
        if not 0.0 <= float(self.intensity) <= 1.0:
            raise ValueError(f"intensity must lie in [0, 1], got {self.intensity!r}")
        if isinstance(self.families, str):
            raise ValueError(f"families must be a collection of names, not the string {self.families!r}")
        families = frozenset(self.families)
        unknown = families - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown fault families {sorted(unknown)}; valid: {', '.join(FAMILIES)}")
        object.__setattr__(self, "intensity", float(self.intensity))
        object.__setattr__(self, "families", families)
        object.__setattr__(self, "thresholds", tuple(
            round(self.intensity * 65536) if f in families else 0 for f in FAMILIES))

    @classmethod
    def none(cls) -> FaultProfile:
        return cls(0.0, frozenset())

    @classmethod
    def only(cls, family: str, intensity: float = DEFAULT_INTENSITY) -> FaultProfile:
        return cls(intensity, frozenset((family,)))

    def without(self, family: str) -> FaultProfile:
        if family not in FAMILIES:
            raise ValueError(f"unknown fault family {family!r}; valid: {', '.join(FAMILIES)}")
        return FaultProfile(self.intensity, self.families - {family})

    def to_dict(self) -> dict:
        return {"intensity": self.intensity, "families": sorted(self.families)}

    @classmethod
    def from_dict(cls, data: dict) -> FaultProfile:
        """The profile whose `to_dict` is `data` (a run.json's `faults`); anything else is
        refused, saying why, rather than read as some other profile."""
        if not isinstance(data, dict):
            raise ValueError(f"a fault profile is a dict (FaultProfile.to_dict), got {data!r}")
        check_keys(data, ("intensity", "families"), "a fault profile")
        families = data["families"]
        if not isinstance(families, list) or not all(isinstance(f, str) for f in families):
            raise ValueError(f"a fault profile's families are a list of names, got {families!r}")
        if len(set(families)) != len(families):
            raise ValueError(f"a fault profile's families name one twice: {families!r}")
        return cls(data["intensity"], frozenset(families))
