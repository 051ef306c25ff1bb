"""`EnvActions`: a scripted policy as a policy of the env's discrete actions (`env:RULE`).

A rule may wait any number of ticks (the finality gate waits up to `min(60, ship_by - now -
10)`); the env's waits are four (`finality_gym.encoder.DEFAULT_WAITS`: 10, 30, 60, 120). Logs of
a rule's decisions that a learner could have taken through the env (an offline dataset,
`python -m train dataset`) must therefore come from a version of the rule whose every call is
one of the env's actions: this one. Each wait becomes the longest of the env's waits that does
not pass the one asked for; a wait shorter than the env's shortest (10 ticks) is not made, and
the rule is told it waited 0 ticks (a rule's short wait lands a call just before a deadline:
waiting 10 would miss it). Every other call is already an env action and passes unchanged. The
rule keeps its own clock from the results, so it sees the time that really passed and plans its
next call from it. Graded by the
shared grader like any policy (`eval headline --policies finality_gate,env:finality_gate`), its
figures sit beside the original's.
"""

from __future__ import annotations

from finality_gym.encoder import DEFAULT_WAITS, action_table
from finality_gym.policy import Call, Policy, PolicyError
from finality_gym.tasks import CALL_BUDGET


def env_wait(ticks: int, waits: tuple[int, ...] = DEFAULT_WAITS) -> int | None:
    """The env's wait that stands for a wait of `ticks`: the longest not past it; None for a
    wait shorter than every one of the env's."""
    fitting = [w for w in waits if w <= ticks]
    return max(fitting) if fitting else None


class EnvActions(Policy):
    """`inner`, every call of which is one of the env's actions (`action_index` gives its
    index). A privileged rule is refused: its calls are the truth's, not a decision a learner
    could be shown."""

    def __init__(self, inner: Policy, waits: tuple[int, ...] = DEFAULT_WAITS):
        if type(inner).privileged:
            raise ValueError(f"env:{inner.name}: a privileged policy acts on the truth; "
                             "env: takes the unprivileged rules")
        self.inner = inner
        self.name = f"env:{inner.name}"
        self.waits = tuple(waits)
        self._index = {(tool, tuple(args.items())): i
                       for i, (tool, args) in enumerate(action_table(self.waits))}

    def reset(self, brief) -> None:
        super().reset(brief)
        self.inner.reset(brief)

    def plan(self):
        result, skipped = None, 0
        while True:
            tool, args = self.inner.act(result)
            if tool == "wait":
                ticks = env_wait(args["ticks"], self.waits)
                if ticks is None:  # no env action waits this little: not waited
                    skipped += 1
                    if skipped > CALL_BUDGET:
                        raise PolicyError(f"{self.name}: {skipped} waits in a row shorter than "
                                          f"the env's shortest ({min(self.waits)} ticks)")
                    result = {"ticks": 0, "tool": "wait", "t": self.now}
                    continue
                args = {"ticks": ticks}
            skipped = 0
            result = yield tool, args

    def action_index(self, call: Call) -> int:
        """The env's action index of a call this policy made."""
        tool, args = call
        return self._index[(tool, tuple(args.items()))]

    def stats(self) -> dict:
        return self.inner.stats()
