"""The shared grader: every policy, scripted or learned, through one runner, into one JSONL.

A run is a `RunConfig` and a folder. `DIR/run.json` pins the configuration; `DIR/episodes.jsonl`
gets one line per graded episode, appended and flushed chunk by chunk, so a killed run loses at
most the chunk in flight. Re-running into the same folder skips every (policy, task, seed)
already there (a torn last line is cut off first), so nothing is lost or duplicated. Chunks are
written in job order whatever the number of workers, so a parallel run writes the same file as a
serial one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing
import os
import random
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from agents import Policy, make_policy, run_episode
from agents.base import PolicyError
from agents.external import ExternalPolicy, code_identity, is_external
from finality_gym import FaultProfile, Task, load_corpus
from finality_gym.corpus import PRIVATE, use_private
from finality_gym.economics import DEFAULT_COSTS, Costs
from finality_gym.episode import PROBE_ARMS

from .labels import failure_label

CHUNK = 128  # episodes per unit of parallel work
MAX_SEEDS = 100  # pass^k is reported for every k up to the seeds: beyond 100 it says nothing new


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
    # The private split's master seed: held in memory, never written (the manifest pins the
    # corpus by its fingerprint).
    master_seed: int | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if (self.split == PRIVATE) != (self.master_seed is not None):
            raise ValueError("the private split and a master seed go together: give both "
                             "--split private and --master-seed, or neither")
        if self.master_seed is not None:
            use_private(self.master_seed)
        if not self.policies:
            raise ValueError("policies: name at least one policy")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies: duplicates in {self.policies}")
        if not self.seeds or any(type(s) is not int or s < 0 for s in self.seeds):
            raise ValueError(f"seeds: must be non-negative ints, got {self.seeds}")
        if len(self.seeds) > MAX_SEEDS:
            raise ValueError(f"seeds: at most {MAX_SEEDS} (a run holds policies x tasks x seeds "
                             f"episodes, and pass^k needs no more), got {len(self.seeds)}")
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

    def cases(self) -> list[tuple[str, int]]:
        """Every (task id, seed) each policy of the run is graded on."""
        task_ids = self.tasks if self.tasks is not None else [
            t.task_id for t in load_corpus(self.split).tasks]
        return [(t, s) for t in task_ids for s in self.seeds]

    def jobs(self) -> list[tuple[str, str, int]]:
        cases = self.cases()
        return [(p, t, s) for p in self.policies for t, s in cases]


def _key(row: dict) -> tuple[str, str, int]:
    return row["policy"], row["task_id"], row["seed"]


def _digest(row: dict) -> str:
    body = json.dumps(row, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def seal(row: dict) -> str:
    """A row as its JSONL line, with `check`: the first 16 hex digits of the SHA-256 of the
    row's canonical JSON. It catches a row edited by hand or written by something else; it is a
    checksum, not a signature (the code that computes it is public)."""
    return json.dumps({**row, "check": _digest(row)}, separators=(",", ":"))


def _verified(row, path: Path, number: int) -> dict:
    if not isinstance(row, dict) or not isinstance(row.get("check"), str):
        raise ValueError(f"{path}:{number} is not a graded episode (no checksum): the file was "
                         "edited or is not this grader's; move it away to start afresh")
    check = row.pop("check")
    if _digest(row) != check or not all(isinstance(row.get(k), t)
                                         for k, t in _ROW_TYPES.items()):
        raise ValueError(f"{path}:{number} fails its checksum: the row was edited; move the "
                         "file away to start afresh")
    return row


_ROW_TYPES = {"policy": str, "task_id": str, "seed": int, "gap": int, "position": int}


def read_rows(path: Path) -> list[dict]:
    """The complete, verified rows of an episodes file; a torn last line (a killed writer) is
    cut off. A line that is not JSON, or a row that fails its checksum, is a clear error."""
    if not path.exists():
        return []
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    rows = []
    for number, line in enumerate(data[:end].splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number} is not a JSON record ({exc}); the file is "
                             "corrupt: move it away to start the run afresh") from None
        rows.append(_verified(row, path, number))
    return rows


def prepare_out(out: Path) -> None:
    """A usable results folder, or a one-line error that names it."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {out} cannot be created: {exc.strerror}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} is not writable")


@contextmanager
def writer_lock(out: Path):
    """Hold `out/.lock` for the run: a second writer on the same folder is refused at once
    instead of both appending every episode."""
    path = out / ".lock"
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "?"
        handle.close()
        raise ValueError(f"{out} is being written by another run (process {holder}); wait for "
                         "it to finish or use another --out folder") from None
    handle.seek(0)
    handle.truncate()
    handle.write(str(os.getpid()))
    handle.flush()
    try:
        yield
    finally:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def input_identity(spec: str) -> str | None:
    """The content hash of what a spec loads from disk (a model file, an outside policy's
    code), or None for the project's own policies."""
    name, _, rest = spec.partition(":")
    if name in ("ppo", "ppo-greedy"):
        path = Path(rest)
        if not path.is_file():
            raise FileNotFoundError(f"no model file at {path}")
        return hashlib.sha256(path.read_bytes()).hexdigest()
    if is_external(spec):
        return code_identity(spec)
    return None


def check_manifest(out: Path, wanted: dict, inputs: dict | None = None) -> None:
    """Pin `wanted` in `out/run.json`, or refuse a folder that holds a run of another one.
    `inputs` maps a policy spec to the hash of what it loads: a spec seen before with other
    content is refused (its rows were graded from something else); new specs are added."""
    manifest_path = out / "run.json"
    found_inputs: dict = {}
    if manifest_path.exists():
        try:
            found = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{manifest_path} is corrupt ({exc})") from None
        if not isinstance(found, dict):
            raise ValueError(f"{manifest_path} is corrupt (not a JSON object)")
        found_inputs = found.pop("inputs", {})
        if found != wanted:
            diff = sorted(k for k in wanted if found.get(k) != wanted[k])
            raise ValueError(f"{out} holds a run with a different configuration ({', '.join(diff)}"
                             "); use another --out folder")
        for spec, digest in (inputs or {}).items():
            if spec in found_inputs and found_inputs[spec] != digest:
                raise ValueError(f"{spec} has changed since its rows in {out} were graded (sha256 "
                                 f"{found_inputs[spec][:12]} then, {digest[:12]} now); grade it "
                                 "into another --out folder")
    merged = {**found_inputs, **(inputs or {})}
    if not manifest_path.exists() or merged != found_inputs:
        manifest_path.write_text(json.dumps({**wanted, "inputs": merged} if merged else wanted,
                                            indent=2) + "\n")


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
            for task_id, seed in config.cases()]


def _run_chunk(args: tuple) -> tuple[list[str], str | None]:
    """One chunk of jobs, run in a worker: the sealed lines in job order, and the error that
    stopped the chunk, if any (the lines of the jobs done before it stay good).

    A chunk holding an outside policy's jobs runs them in an order drawn from the operating
    system's entropy, never recorded: the job order is public (policy, task, seed in corpus
    order), so a policy that counted its cases could otherwise tell which task, and which half
    of a twin pair, it holds. Every episode depends only on its (task, seed), and the lines
    still come out in job order, so the file is the same."""
    config, jobs = args
    if config.master_seed is not None:  # a worker started fresh does not have it yet
        use_private(config.master_seed)
    corpus = load_corpus(config.split)
    order = list(range(len(jobs)))
    if any(is_external(spec) for spec, _, _ in jobs):
        random.SystemRandom().shuffle(order)
    done: dict[int, str] = {}
    error = None
    for i in order:
        spec, task_id, seed = jobs[i]
        try:
            policy = _POLICIES.get(spec)
            if policy is None:
                policy = _POLICIES[spec] = make_policy(spec)
            row = grade_row(policy, spec, corpus.task(task_id), seed, config)
        except Exception as exc:  # any failure of a policy, in its own words, located
            what = str(exc) if isinstance(exc, PolicyError) else f"{type(exc).__name__}: {exc}"
            error = f"policy {spec!r} failed on task {task_id} seed {seed}: {what}"
            break
        done[i] = seal(row)
    return [done[i] for i in sorted(done)], error


def _close_external() -> None:
    """Outside policies get a fresh process for every run."""
    for spec in [s for s, p in _POLICIES.items() if isinstance(p, ExternalPolicy)]:
        _POLICIES.pop(spec).close()


def _run_chunk_alone(args: tuple) -> tuple[list[str], str | None]:
    """A chunk in a long-lived Ray worker: outside policies' processes do not outlive it."""
    try:
        return _run_chunk(args)
    finally:
        _close_external()


def _chunks(config: RunConfig, jobs: list) -> Iterator[tuple]:
    for i in range(0, len(jobs), CHUNK):
        yield config, jobs[i:i + CHUNK]


MAX_WORKERS = 4 * (os.cpu_count() or 1)
BACKENDS = ("local", "ray")
_BACKEND = ["local"]


def use_backend(name: str) -> None:
    """Where the grader's chunks run from now on: `local` processes (the default) or `ray`
    tasks (`eval/distributed.py`); the episodes file is the same."""
    if name not in BACKENDS:
        raise ValueError(f"--backend: unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
    if name == "ray":
        from . import distributed  # noqa: F401  (Ray missing: an ImportError now, not mid-run)
    _BACKEND[0] = name


def grade(config: RunConfig, out: Path, workers: int = 1, progress: bool = True,
          desc: str = "grading") -> list[dict]:
    """Run every missing job of `config` into `out/episodes.jsonl`; return the config's rows."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must lie in 1..{MAX_WORKERS} (4 per core: more processes "
                         f"than that only add overhead), got {workers}")
    if _BACKEND[0] == "ray" and config.master_seed is not None:
        raise ValueError("--backend ray does not grade the private split: its master seed "
                         "would travel to every Ray worker (another machine's, on a cluster)")
    inputs = {spec: digest for spec in config.policies
              if (digest := input_identity(spec)) is not None}
    for spec in config.policies:  # fail now, not in a worker (an outside policy starts no
        make_policy(spec)           # process before its first case)
    prepare_out(out)
    with writer_lock(out):
        check_manifest(out, config.manifest(), inputs)
        return _grade_locked(config, out, workers, progress, desc)


def _grade_locked(config: RunConfig, out: Path, workers: int, progress: bool,
                  desc: str) -> list[dict]:
    path = out / "episodes.jsonl"
    rows = read_rows(path)
    done = {_key(row) for row in rows}
    todo = [job for job in config.jobs() if job not in done]
    error = None
    if todo:
        bar = _progress(len(todo), desc, progress)
        with open(path, "a") as f:
            # A learned policy's torch may hold threads that a forked child would inherit
            # locked: such runs start their workers fresh.
            fresh = any(spec.startswith(("ppo:", "ppo-greedy:")) for spec in config.policies)
            try:
                for lines, error in _map(_run_chunk, _chunks(config, todo), workers, fresh):
                    if lines:
                        f.write("\n".join(lines) + "\n")
                        f.flush()
                        for line in lines:  # our own lines, sealed by the worker just now
                            row = json.loads(line)
                            del row["check"]
                            rows.append(row)
                        bar.update(len(lines))
                    if error is not None:
                        break
            finally:
                _close_external()
        bar.close()
    if error is not None:
        raise PolicyError(f"{error} (the {len(rows)} episodes recorded in {path} stay valid)")
    wanted = set(config.jobs())
    rows = [row for row in rows if _key(row) in wanted]
    if len(rows) != len(wanted):
        raise ValueError(f"{path} holds {len(rows)} of the {len(wanted)} episodes of this run "
                         "(duplicated or foreign lines?)")
    return rows


def _map(fn, items: Iterable, workers: int, fresh: bool = False) -> Iterator:
    if _BACKEND[0] == "ray":
        from .distributed import ordered_map
        yield from ordered_map(_run_chunk_alone if fn is _run_chunk else fn, items, workers)
        return
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
