"""What a run may spend (`--max-cost`), shared by the threads that play its episodes: an episode
starts only while the run has money left, so a run stops between episodes, never mid-way, and a
re-run with a larger budget completes it."""

from __future__ import annotations

import threading

from .errors import BudgetSpent


class Budget:
    """What a run may spend on requests (`max_cost`), in integer micro-dollars, shared by its
    threads: `spent` starts at what the folder's graded rows cost."""

    def __init__(self, limit_usd: float, spent: int = 0):
        self.limit = round(limit_usd * 1_000_000)
        self.spent = spent
        self._lock = threading.Lock()

    def add(self, cost: int) -> None:
        with self._lock:
            self.spent += cost

    def check(self) -> None:
        with self._lock:
            if self.spent >= self.limit:
                raise BudgetSpent(f"the run has spent ${self.spent / 1e6:.4f} of its --max-cost "
                                  f"${self.limit / 1e6:.4f}: no new episode starts")
