"""What bounding a submitted model costs (issue 41, classes 5 and 6): `models/ppo_full.zip`
exported to ONNX (`python -m train export`), then, in one run, alternated:

- per call: onnxruntime's bare `session.run` against the bounded runner's watched call (a
  `RunOptions` a watchdog thread may terminate), on the load check's real observations;
- per load: parsing, onnx's checker and a session (what `onnx:` did on 8b36e67, with its one
  zero observation) against `load_onnx` (the same, the static bounds, and the load check on
  real observations);
- per episode: `onnx:` and `onnx-greedy:` graded in process on public x `--seeds`, bounded (the
  policy `make_policy` makes) against the same runner with the watch taken off;
- per SB3 model: `load_sb3` of the shipped model with the archive's bounds (its zip directory,
  members, weights' index and size checked) against SB3's own `load` of it.

Each figure is the median of `--repeats` alternated rounds.

    .venv/bin/python benchmarks/model_bounds.py [--repeats 5] [--seeds 0-1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODEL = ROOT / "models" / "ppo_full.zip"


class Bare:
    """A runner's watch taken off: the session run as onnx: ran it on 8b36e67."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    @staticmethod
    def run(session, outputs, feed):
        return session.run(outputs, feed)


def rounds(repeats: int, contenders: dict) -> dict[str, float]:
    """{name: median seconds of one call of its function}, the contenders taking turns."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, call in contenders.items():
            started = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def per_call(graph: Path, repeats: int) -> dict[str, float]:
    from agents.learned.policy import real_steps
    from agents.learned.onnx_policy import _Runner, checked_graph, open_session, signature
    session = open_session(checked_graph(graph))
    found = signature(session, graph)
    watched, bare = _Runner(session, found, True, 16), _Runner(session, found, True, 16)
    bare.watch = Bare()
    steps = [(obs, mask) for obs, mask, _ in real_steps()] * 20
    watched.start(0)

    def play(runner):
        return lambda: [runner.forward(obs, mask) for obs, mask in steps]
    medians = rounds(repeats, {"bare": play(bare), "watched": play(watched)})
    watched.watch.stop()
    return {name: seconds / len(steps) for name, seconds in medians.items()}


def per_load(graph: Path, repeats: int) -> dict[str, float]:
    import onnx

    from agents.learned.onnx_policy import load_onnx, open_session

    def unbounded():
        data = graph.read_bytes()
        onnx.checker.check_model(onnx.load_model_from_string(data))
        session = open_session(data)
        session.run(None, {"obs": np.zeros((1, 58), dtype=np.float32)})
    load_onnx(graph)  # the real observations, made once a process
    return rounds(repeats, {"8b36e67's checks": unbounded, "bounded": lambda: load_onnx(graph)})


def per_episode(graph: Path, seeds: tuple[int, ...], repeats: int) -> dict[str, float]:
    from agents import make_policy
    from eval.grading.grader import RunConfig, grade_in_process
    config = RunConfig(("x",), seeds=seeds)
    contenders, episodes = {}, len(config.cases())
    for kind in ("onnx", "onnx-greedy"):
        bounded, bare = make_policy(f"{kind}:{graph}"), make_policy(f"{kind}:{graph}")
        runner = bare.predict.__self__  # the runner behind the policy
        runner.watch = Bare()
        for label, policy in ((f"{kind} bare", bare), (f"{kind} bounded", bounded)):
            contenders[label] = lambda p=policy: grade_in_process(p, "x", config)
    return {name: episodes / seconds for name, seconds in rounds(repeats, contenders).items()}


def per_sb3_load(repeats: int) -> dict[str, float]:
    from stable_baselines3 import PPO

    from agents.learned.policy import load_sb3
    return rounds(repeats, {"SB3's load": lambda: PPO.load(MODEL, device="cpu"),
                            "bounded": lambda: load_sb3(MODEL)})


def main() -> None:
    from train.export import export
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="alternated rounds (median)")
    parser.add_argument("--seeds", default="0-1", help="grading seeds, FIRST-LAST (default 0-1)")
    args = parser.parse_args()
    first, _, last = args.seeds.partition("-")
    seeds = tuple(range(int(first), int(last or first) + 1))
    with tempfile.TemporaryDirectory() as tmp:
        graph = Path(tmp) / "ppo_full.onnx"
        export(MODEL, graph)
        calls = per_call(graph, args.repeats)
        print(f"a call: bare {calls['bare'] * 1e6:.1f} us, watched {calls['watched'] * 1e6:.1f} "
              f"us ({calls['watched'] / calls['bare']:.3f}x)", flush=True)
        loads = per_load(graph, args.repeats)
        print("a load: " + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in loads.items()),
              flush=True)
        rates = per_episode(graph, seeds, args.repeats)
        for kind in ("onnx", "onnx-greedy"):
            bare, bounded = rates[f"{kind} bare"], rates[f"{kind} bounded"]
            print(f"{kind}: {bare:,.0f} episodes/s bare, {bounded:,.0f} bounded "
                  f"({bounded / bare:.3f}x), in process, public x seeds {args.seeds}", flush=True)
    sb3 = per_sb3_load(args.repeats)
    print("sb3 load of ppo_full.zip: " + ", ".join(f"{k} {v * 1e3:.1f} ms"
                                                  for k, v in sb3.items()))


if __name__ == "__main__":
    main()
