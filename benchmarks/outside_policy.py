"""Cost of the process boundary and of the operating-system sandbox: the finality gate graded in
the grader's process, then the same class as an outside policy (`agents.scripted:FinalityGate`:
its own process, a fork per case) without the sandbox and in it, with one and two workers, on
`public` x 3 seeds (963 episodes) into fresh folders; and a policy that imports torch and loads a
stable-baselines3 model at import (`models/ppo_full.zip`, in a package of its own, so the sandbox
shows it the model), sandboxed, two workers. Each figure is the whole `grade` call (the
sandbox's self-test and the policy's load check included); the ratios are of one run. Last, what
a new chunk's fork server costs (every chunk of work imports the policy afresh).

    .venv/bin/python benchmarks/outside_policy.py
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


TORCH_POLICY = """from pathlib import Path

from agents.learned.policy import load_sb3
from finality_gym.policy import Policy

MODEL = load_sb3(Path(__file__).with_name("model.zip"))  # torch and the model: once


class Loaded(Policy):
    name = "loaded_ppo"

    def reset(self, brief):
        MODEL.reset(brief)

    def act(self, result):
        return MODEL.act(result)
"""


def main() -> None:
    from agents import make_policy, run_episode
    from agents.sandbox.self_test import unavailable
    from finality_gym import load_corpus
    from eval.grading.grader import CHUNK, RunConfig, grade
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
    if unavailable() is None:
        with tempfile.TemporaryDirectory() as tmp:
            package = Path(tmp) / "torch_policy"
            package.mkdir()
            shutil.copy(ROOT / "models" / "ppo_full.zip", package / "model.zip")
            (package / "__init__.py").write_text(TORCH_POLICY)
            sys.path.insert(0, tmp)
            os.environ["PYTHONPATH"] = tmp
            timed = {}
            for seeds in ((0,), (0, 1, 2, 3, 4)):
                config = RunConfig(("torch_policy:Loaded",), seeds=seeds)
                started = time.perf_counter()
                rows = grade(config, Path(tmp) / f"run{len(seeds)}", workers=2, progress=False)
                timed[len(rows)] = time.perf_counter() - started
        (few, t_few), (many, t_many) = sorted(timed.items())
        print(f"a policy that loads a PPO model at import, sandboxed, 2 workers: "
              f"{many / t_many:,.0f} episodes/s over {many} episodes, {(many - few) / (t_many - t_few):,.0f} "
              f"episodes/s once started (each of its processes imports torch and the model once: "
              f"{t_few:.1f} s for {few} episodes)", flush=True)
    task = load_corpus("public").tasks[0]
    for sandbox in (False, True) if unavailable() is None else (False,):
        policy = make_policy("agents.scripted:FinalityGate", sandbox=sandbox)
        times = {False: [], True: []}
        for _ in range(10):
            for fresh in (False, True):
                if fresh:
                    policy.new_chunk()  # the next case starts a new chunk: a new fork server
                started = time.perf_counter()
                run_episode(policy, task, 0)
                times[fresh].append(time.perf_counter() - started)
        policy.close()
        cost = statistics.median(times[True]) - statistics.median(times[False])
        print(f"a new chunk's fork server ({'sandboxed' if sandbox else 'no sandbox'}, medians "
              f"of 10): {1000 * cost:.1f} ms, {1000 * cost / CHUNK:.2f} ms a case over a chunk of "
              f"{CHUNK}", flush=True)
    for workers in (1, 2):
        if ("outside, sandboxed", workers) in rates:
            bare, boxed = rates["outside, no sandbox", workers], rates["outside, sandboxed", workers]
            print(f"{workers} worker(s): sandboxed / unsandboxed {boxed / bare:.3f} "
                  f"({1000 * workers / boxed - 1000 * workers / bare:.2f} ms more per case)")


if __name__ == "__main__":
    main()
