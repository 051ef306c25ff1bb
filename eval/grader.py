"""The shared grader: every policy, scripted or learned, through one runner, into one JSONL.

A run is a `RunConfig` and a folder. `DIR/run.json` pins the configuration; `DIR/episodes.jsonl`
gets one line per graded episode, appended and flushed chunk by chunk, so a killed run loses at
most the chunk in flight. Re-running into the same folder skips every (policy, task, seed)
already there (a torn last line is cut off first), so nothing is lost or duplicated. Chunks are
written in job order whatever the number of workers, so a parallel run writes the same file as a
serial one.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from agents import Policy, make_policy, run_episode
from finality_gym import FaultProfile, Task, load_corpus
from finality_gym.economics import DEFAULT_COSTS, Costs
from finality_gym.episode import PROBE_ARMS

from .labels import failure_label

CHUNK = 128  # episodes per unit of parallel work


@dataclass(frozen=True)
class RunConfig:
    """What a set of graded episodes was run under; the policies may grow across resumes."""

    policies: tuple[str, ...]
    split: str = "public"
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    probe: str = "full"
    faults: FaultProfile = field(default_factory=FaultProfile)
    costs: Costs = DEFAULT_COSTS
    tasks: tuple[str, ...] | None = None  # a subset of task ids; None: the whole split

    def __post_init__(self) -> None:
        if not self.policies:
            raise ValueError("policies: name at least one policy")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies: duplicates in {self.policies}")
        if not self.seeds or any(type(s) is not int or s < 0 for s in self.seeds):
            raise ValueError(f"seeds: must be non-negative ints, got {self.seeds}")
        if self.probe not in PROBE_ARMS:
            raise ValueError(f"probe: unknown arm {self.probe!r}; valid: {', '.join(PROBE_ARMS)}")
        corpus = load_corpus(self.split)  # raises on an unknown split
        for task_id in self.tasks or ():
            corpus.task(task_id)

    def manifest(self) -> dict:
        """The part a resumed run must share with the original (the policies may differ)."""
        return {"split": self.split, "fingerprint": load_corpus(self.split).fingerprint,
                "seeds": list(self.seeds), "probe": self.probe, "faults": self.faults.to_dict(),
                "costs": self.costs.to_dict(), "tasks": None if self.tasks is None else list(self.tasks)}

    def jobs(self) -> list[tuple[str, str, int]]:
        corpus = load_corpus(self.split)
        task_ids = self.tasks if self.tasks is not None else [t.task_id for t in corpus.tasks]
        return [(p, t, s) for p in self.policies for t in task_ids for s in self.seeds]


def _key(row: dict) -> tuple[str, str, int]:
    return row["policy"], row["task_id"], row["seed"]


def read_rows(path: Path) -> list[dict]:
    """The complete lines of a JSONL file; a torn last line (a killed writer) is cut off."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    rows = []
    for number, line in enumerate(data[:end].splitlines(), 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number} is not a JSON record ({exc}); the file is "
                             "corrupt: move it away to start the run afresh") from None
    return rows


def check_manifest(out: Path, wanted: dict) -> None:
    """Pin `wanted` in `out/run.json`, or refuse a folder that holds a run of another one."""
    manifest_path = out / "run.json"
    if manifest_path.exists():
        try:
            found = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{manifest_path} is corrupt ({exc})") from None
        if found != wanted:
            diff = sorted(k for k in wanted if found.get(k) != wanted[k])
            raise ValueError(f"{out} holds a run with a different configuration ({', '.join(diff)}"
                             "); use another --out folder")
    else:
        manifest_path.write_text(json.dumps(wanted, indent=2) + "\n")


_POLICIES: dict = {}


def grade_row(policy: Policy, name: str, task: Task, seed: int, config: RunConfig) -> dict:
    """One graded episode as a JSONL row: the record, the policy's name, the failure label and
    the policy's own per-episode fields (a model's requests and tokens)."""
    record = run_episode(policy, task, seed, faults=config.faults, probe=config.probe,
                         costs=config.costs)
    return {"policy": name, **record.to_dict(), "label": failure_label(record), **policy.stats()}


def grade_in_process(policy: Policy, name: str, config: RunConfig) -> list[dict]:
    """Grade a policy object (for example a model being trained) on every task and seed of
    `config`, in this process and without files; the rows are those `grade` would write."""
    corpus = load_corpus(config.split)
    return [grade_row(policy, name, corpus.task(task_id), seed, config)
            for _, task_id, seed in dataclasses.replace(config, policies=(name,)).jobs()]


def _run_chunk(args: tuple) -> list[str]:
    """One chunk of jobs, run in a worker; returns the JSON lines in job order."""
    config, jobs = args
    corpus = load_corpus(config.split)
    lines = []
    for spec, task_id, seed in jobs:
        policy = _POLICIES.get(spec)
        if policy is None:
            policy = _POLICIES[spec] = make_policy(spec)
        row = grade_row(policy, spec, corpus.task(task_id), seed, config)
        lines.append(json.dumps(row, separators=(",", ":")))
    return lines


def _chunks(config: RunConfig, jobs: list) -> Iterator[tuple]:
    for i in range(0, len(jobs), CHUNK):
        yield config, jobs[i:i + CHUNK]


def grade(config: RunConfig, out: Path, workers: int = 1, progress: bool = True,
          desc: str = "grading") -> list[dict]:
    """Run every missing job of `config` into `out/episodes.jsonl`; return the config's rows."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    for spec in config.policies:  # fail now, not in a worker
        make_policy(spec)
    out.mkdir(parents=True, exist_ok=True)
    check_manifest(out, config.manifest())
    path = out / "episodes.jsonl"
    rows = read_rows(path)
    done = {_key(row) for row in rows}
    todo = [job for job in config.jobs() if job not in done]
    if todo:
        bar = _progress(len(todo), desc, progress)
        with open(path, "a") as f:
            # A learned policy's torch may hold threads that a forked child would inherit
            # locked: such runs start their workers fresh.
            fresh = any(spec.startswith(("ppo:", "ppo-greedy:")) for spec in config.policies)
            for lines in _map(_run_chunk, _chunks(config, todo), workers, fresh):
                f.write("\n".join(lines) + "\n")
                f.flush()
                rows.extend(map(json.loads, lines))  # while the workers run the next chunks
                bar.update(len(lines))
        bar.close()
    wanted = set(config.jobs())
    rows = [row for row in rows if _key(row) in wanted]
    if len(rows) != len(wanted):
        raise ValueError(f"{path} holds {len(rows)} of the {len(wanted)} episodes of this run "
                         "(duplicated or foreign lines?)")
    return rows


def _map(fn, items: Iterable, workers: int, fresh: bool = False) -> Iterator:
    if workers == 1:
        yield from map(fn, items)
        return
    method = "fork" if sys.platform.startswith("linux") and not fresh else "spawn"
    with multiprocessing.get_context(method).Pool(workers) as pool:
        yield from pool.imap(fn, items)


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, desc: str, enabled: bool):
    if not enabled or os.environ.get("FINALITY_NO_PROGRESS"):
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="ep", file=sys.stderr, mininterval=0.5)
