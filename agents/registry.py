"""Every policy by name. A spec is a name (`sop`), a name with knobs
(`sop:poll_interval=30,max_polls=6`), an open-loop plan (`plan:W1,RETRY,W2,TERMINAL`, for
example `plan:60,original,120,ship`), `ppo:PATH` for a saved stable-baselines3 model, sampled
with a per-episode seed (`ppo-greedy:PATH`: its most likely actions; loading a model unpickles
code: load only files you trust), or a policy from outside the project, `FILE.py:CLASS` or
`MODULE:CLASS`, graded in its own process (`agents/external.py`)."""

from __future__ import annotations

import argparse

from . import scripted
from .base import Policy
from .external import ExternalPolicy, is_external

_CLASSES = {cls.name: cls for cls in (
    scripted.RandomPolicy, scripted.Optimistic, scripted.Eager, scripted.MajorityVote,
    scripted.SOP, scripted.ReAct, scripted.Reflection, scripted.FinalityGate,
    scripted.FinalityOracle, scripted.AlwaysShip, scripted.AlwaysRefund, scripted.AlwaysEscalate,
    scripted.DoNothing)}
HEADLINE = ("random", "optimistic", "eager", "majority_vote", "sop", "react", "reflection",
            "finality_gate", "finality_oracle")
FLOORS = ("always_ship", "always_refund", "always_escalate", "do_nothing")


def is_unprivileged_scripted(spec: str) -> bool:
    """A rule written by hand that sees only tool results: not the oracle, not a model."""
    cls = _CLASSES.get(spec.partition(":")[0])
    return cls is not None and not cls.privileged


BUILTIN = (*_CLASSES, "plan", "ppo", "ppo-greedy")


def split_specs(text: str) -> tuple[str, ...]:
    """A comma-separated list of specs, where a spec's own arguments may hold commas
    (`sop:poll_interval=30,max_polls=6`, `plan:60,original,120,ship`): a piece that does not
    start a spec (a built-in name, or a file or module with `:CLASS`) continues the last one."""
    if not text.strip(" ,"):
        raise argparse.ArgumentTypeError("name at least one policy")
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if specs and not (piece.partition(":")[0] in BUILTIN or is_external(piece)):
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return tuple(specs)


def make_policy(spec: str) -> Policy:
    if is_external(spec):
        return ExternalPolicy(spec)
    name, _, rest = spec.partition(":")
    if name in ("ppo", "ppo-greedy"):
        if not rest:
            raise ValueError(f"{name}:PATH needs the path of a saved model")
        from .learned import load_sb3
        return load_sb3(rest, greedy=name == "ppo-greedy")
    if name == "plan":
        parts = rest.split(",")
        if len(parts) != 4 or not parts[0].isdigit() or not parts[2].isdigit():
            raise ValueError(f"bad plan {spec!r}; expected plan:W1,RETRY,W2,TERMINAL")
        return scripted.OpenLoopPlan(int(parts[0]), parts[1], int(parts[2]), parts[3])
    if name not in _CLASSES:
        raise ValueError(f"unknown policy {spec!r}; valid: {', '.join(_CLASSES)}, "
                         "plan:W1,RETRY,W2,TERMINAL, ppo:PATH, ppo-greedy:PATH, FILE.py:CLASS, "
                         "MODULE:CLASS")
    if not rest:
        return _CLASSES[name]()
    if name != "sop":
        raise ValueError(f"policy {name!r} takes no knobs, got {rest!r}")
    knobs = {}
    for item in rest.split(","):
        key, eq, value = item.partition("=")
        if not eq or key not in ("poll_interval", "max_polls") or not value.isdigit():
            raise ValueError(f"bad knob {item!r} in {spec!r}; sop takes poll_interval=INT, "
                             "max_polls=INT")
        knobs[key] = int(value)
    return scripted.SOP(**knobs)
