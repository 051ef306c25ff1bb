"""Cost of the process boundary: the finality gate graded in the grader's process against the
same class graded as an outside policy (`agents.scripted:FinalityGate`, its own process, a fork
per case), one worker each, on `public` x 1 seed, into fresh folders; the ratio is of one run.

    .venv/bin/python benchmarks/outside_policy.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from eval.grader import RunConfig, grade
    rates = {}
    for spec in ("finality_gate", "agents.scripted:FinalityGate"):
        config = RunConfig((spec,), seeds=(0,))
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            rows = grade(config, Path(tmp), workers=1, progress=False)
            rates[spec] = len(rows) / (time.perf_counter() - started)
        print(f"{spec}: {rates[spec]:,.0f} episodes/s", flush=True)
    inside, outside = rates.values()
    print(f"outside / inside: {outside / inside:.3f} ({1000 / outside - 1000 / inside:.2f} ms "
          "more per case)")


if __name__ == "__main__":
    main()
