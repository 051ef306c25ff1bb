"""Cost of the process boundary and of the operating-system sandbox: the finality gate graded in
the grader's process, then the same class as an outside policy (`agents.scripted:FinalityGate`:
its own process, a fork per case) without the sandbox and in it, with one and two workers, on
`public` x 3 seeds (963 episodes) into fresh folders. Each figure is the whole `grade` call (the
sandbox's self-test and the policy's load check included); the ratios are of one run.

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
    from agents.sandbox import unavailable
    from eval.grader import RunConfig, grade
    runs = [("in process", "finality_gate", True, 1),
            ("outside, no sandbox", "agents.scripted:FinalityGate", False, 1),
            ("outside, no sandbox", "agents.scripted:FinalityGate", False, 2)]
    if unavailable() is None:
        runs += [("outside, sandboxed", "agents.scripted:FinalityGate", True, 1),
                 ("outside, sandboxed", "agents.scripted:FinalityGate", True, 2)]
    else:
        print(f"no sandbox here: {unavailable()}")
    rates = {}
    for label, spec, sandbox, workers in runs:
        config = RunConfig((spec,), seeds=(0, 1, 2), sandbox=sandbox)
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            rows = grade(config, Path(tmp), workers=workers, progress=False)
            rates[label, workers] = len(rows) / (time.perf_counter() - started)
        print(f"{label}, {workers} worker(s): {rates[label, workers]:,.0f} episodes/s", flush=True)
    for workers in (1, 2):
        if ("outside, sandboxed", workers) in rates:
            bare, boxed = rates["outside, no sandbox", workers], rates["outside, sandboxed", workers]
            print(f"{workers} worker(s): sandboxed / unsandboxed {boxed / bare:.3f} "
                  f"({1000 * workers / boxed - 1000 * workers / bare:.2f} ms more per case)")


if __name__ == "__main__":
    main()
