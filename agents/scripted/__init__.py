"""The scripted policies: the nine of docs/world.md section 9, the floors and open-loop plans
(`rules.py`), and the verdicts they read off tool results (`verdicts.py`).

What it may import: `finality_gym` (the interface, the readings, the oracle's plan), nothing
else of `agents/`. What imports it: the registry and the factory, the experiments that name a
rule's class (`eval/experiments/plans.py`, `eval/reports/report.py`), and any outside policy
that builds on a rule. Its classes are re-exported here, so that `agents.scripted:FinalityGate`
names the gate as an outside policy, as it always has.
"""

from .rules import (SOP, AlwaysEscalate, AlwaysRefund, AlwaysShip, DoNothing, Eager,
                    FinalityGate, FinalityOracle, MajorityVote, OpenLoopPlan, Optimistic,
                    RandomPolicy, ReAct, Reflection)

__all__ = ["SOP", "AlwaysEscalate", "AlwaysRefund", "AlwaysShip", "DoNothing", "Eager",
           "FinalityGate", "FinalityOracle", "MajorityVote", "OpenLoopPlan", "Optimistic",
           "RandomPolicy", "ReAct", "Reflection"]
