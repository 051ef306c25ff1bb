"""The project's own policies by name, and the line-ups the commands grade: one table each.

`CLASSES` maps every scripted policy's name (its spec) to its class: the nine of docs/world.md
section 9 and the four floors. `HEADLINE` is the nine, in the order every table shows them: the
default line-up of `python -m eval headline` and every experiment (the Makefile's `grade-models`
asks this module for it). `GATE` is the policy the model arm and the cost sweep compare against.
"""

from __future__ import annotations

from . import scripted

CLASSES = {cls.name: cls for cls in (
    scripted.RandomPolicy, scripted.Optimistic, scripted.Eager, scripted.MajorityVote,
    scripted.SOP, scripted.ReAct, scripted.Reflection, scripted.FinalityGate,
    scripted.FinalityOracle, scripted.AlwaysShip, scripted.AlwaysRefund, scripted.AlwaysEscalate,
    scripted.DoNothing)}
SCRIPTED = tuple(CLASSES)
FLOORS = ("always_ship", "always_refund", "always_escalate", "do_nothing")
HEADLINE = tuple(name for name in SCRIPTED if name not in FLOORS)
GATE = scripted.FinalityGate.name

