"""The shared grader: every policy, scripted or learned, through one runner, into one JSONL.

A run is a `RunConfig` and a folder (`eval/grading/runfolder.py` owns the folder: its lock, its
manifest, its sealed rows). `DIR/run.json` pins the configuration; `DIR/episodes.jsonl` gets one
line per graded episode, appended and flushed as episodes complete, so a killed run loses at
most the work in flight. Re-running into the same folder skips every (policy, task, seed)
already there (a torn last line is cut off first), so nothing is lost or duplicated. Lines are
written in job order whatever the number of workers, threads or Ray tasks (a run with outside
code plays its jobs in a random order, writes them as they complete and puts the file in job
order at its end), so a parallel run writes the same file as a serial one.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from agents import Policy, PolicyError, PolicySpec, make_policy, play
from agents.sandbox.external import ExternalPolicy, PolicyLoadError
from agents.sandbox.self_test import self_test
from agents.learned.vecnormalize import normalization_file
from finality_gym import FaultProfile, Task, load_corpus
from finality_gym.corpus import PRIVATE, Corpus, private_corpus
from finality_gym.economics import DEFAULT_COSTS, Costs
from finality_gym.episode import PROBE_ARMS, compact_calls

import eval.grading.runfolder as runfolder
from eval.grading.labels import failure_label
from eval.grading.runfolder import OrderedAppender, key, read_rows, seal

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
    # Outside policies run in the operating-system sandbox (agents/sandbox/) unless False.
    sandbox: bool = True
    # Saved models loaded by unpickling, as stable-baselines3 does (code in the file runs in the
    # grader): only with --trust-pickles, never on the private split. By default they load as
    # data (agents/learned/sb3_archive.py).
    trust_pickles: bool = False
    # The name each policy's rows carry (`policy`), in the order of `policies`; None: its spec.
    # A verified bundle's rows name the spec as the bundle does (`my_policy.py:Agent`), while
    # the grader loads it from where the board extracted it (an absolute path).
    names: tuple[str, ...] | None = None
    # Every episode behind the guard (finality_gym/guard.py): the model arm's `guarded` regime.
    guard: bool = False

    def __post_init__(self) -> None:
        if (self.split == PRIVATE) != (self.master_seed is not None):
            raise ValueError("the private split and a master seed go together: give both "
                             "--split private and --master-seed-file (or FINALITY_MASTER_SEED, "
                             "or --master-seed), or neither")
        if self.split == PRIVATE and not self.sandbox:
            raise ValueError("--sandbox off is refused for --split private: a policy outside "
                             "the sandbox can read the grader's memory, and with it the split")
        if self.split == PRIVATE and self.trust_pickles:
            raise ValueError("--trust-pickles is refused for --split private: a model's pickles "
                             "would run in the grader's process, which holds the master seed")
        if not self.policies:
            raise ValueError("policies: name at least one policy")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies: duplicates in {self.policies}")
        if self.names is not None and (len(self.names) != len(self.policies) or len(
                set(self.names)) != len(self.names) or not all(self.names)):
            raise ValueError(f"names: one distinct name per policy, got {self.names}")
        if not self.seeds or any(type(s) is not int or s < 0 for s in self.seeds):
            raise ValueError(f"seeds: must be non-negative ints, got {self.seeds}")
        if len(self.seeds) > MAX_SEEDS:
            raise ValueError(f"seeds: at most {MAX_SEEDS} (a run holds policies x tasks x seeds "
                             f"episodes, and pass^k needs no more), got {len(self.seeds)}")
        if self.probe not in PROBE_ARMS:
            raise ValueError(f"probe: unknown arm {self.probe!r}; valid: {', '.join(PROBE_ARMS)}")
        corpus = self.corpus  # raises on an unknown split
        for task_id in self.tasks or ():
            corpus.task(task_id)

    @property
    def corpus(self) -> Corpus:
        """The split's tasks: published, or made from the master seed this config holds."""
        if self.split == PRIVATE:
            return private_corpus(self.master_seed)
        return load_corpus(self.split)

    def manifest(self) -> dict:
        """The part a resumed run must share with the original (the policies may differ); the
        unpickling loader is recorded only where it was used (older folders resume as they
        were); so is the guard."""
        return {"split": self.split, "fingerprint": self.corpus.fingerprint,
                "seeds": list(self.seeds), "probe": self.probe, "faults": self.faults.to_dict(),
                "costs": self.costs.to_dict(), "tasks": None if self.tasks is None else list(self.tasks),
                **({"trust_pickles": True} if self.trust_pickles else {}),
                **({"guard": True} if self.guard else {})}

    def cases(self) -> list[tuple[str, int]]:
        """Every (task id, seed) each policy of the run is graded on."""
        task_ids = self.tasks if self.tasks is not None else [
            t.task_id for t in self.corpus.tasks]
        return [(t, s) for t in task_ids for s in self.seeds]

    def jobs(self) -> list[tuple[str, str, int]]:
        cases = self.cases()
        return [(p, t, s) for p in self.policies for t, s in cases]

    def name(self, spec: str) -> str:
        """The name the rows of a policy of this run carry."""
        return spec if self.names is None else self.names[self.policies.index(spec)]

    def named(self, job: tuple[str, str, int]) -> tuple[str, str, int]:
        """A job as its row's key (`runfolder.key`)."""
        return (self.name(job[0]), *job[1:]) if self.names is not None else job


def input_identity(spec: str) -> str | None:
    """The content hash of what a spec loads from disk (a model file, an outside policy's
    code; a model's observation normalization beside it too), or None for the project's own
    policies."""
    parsed = PolicySpec.parse(spec)
    source = parsed.source()
    if source is None:
        return None
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    normalization = normalization_file(source) if parsed.learned else None
    if normalization is None:
        return digest
    both = source.read_bytes() + b"\0" + normalization.read_bytes()
    return hashlib.sha256(both).hexdigest()


def grade_row(policy: Policy, name: str, task: Task, seed: int,
              config: "RunConfig | Chunk") -> dict:
    """One graded episode as a JSONL row: the record, the policy's name, the failure label, the
    policy's own per-episode fields (a model's requests and tokens) and `calls`, the calls it
    made (`finality_gym.episode.compact_calls`), from which the engine rebuilds the episode that
    was graded (`replay`) to show it. `config` says how it is played (its `faults`, `probe`,
    `costs` and `guard`)."""
    episode = play(policy, task, seed, faults=config.faults, probe=config.probe,
                   costs=config.costs, guard=config.guard)
    if isinstance(policy, ExternalPolicy):
        policy.finish()  # the host ends the case; one that sent past its end fails here
    record = episode.record()
    return {"policy": name, **record.to_dict(), "label": failure_label(record), **policy.stats(),
            "calls": compact_calls(episode.history)}


def without_calls(row: dict) -> dict:
    """A graded row as `grade` returns it: every field but `calls` (which the file keeps; the
    statistics never read them, and parsing them again was a third of the main process's time
    in the experiments). A copy less one key, not a comprehension: it runs once a row."""
    short = row.copy()
    short.pop("calls", None)
    return short


def grade_in_process(policy: Policy, name: str, config: RunConfig) -> list[dict]:
    """Grade a policy object (for example a model being trained) on every task and seed of
    `config`, in this process and without files; the rows are those `grade` would write."""
    corpus = config.corpus
    return [grade_row(policy, name, corpus.task(task_id), seed, config)
            for task_id, seed in config.cases()]


# ------------------------------------------------------------------ where the episodes run
BACKENDS = ("local", "ray")
MAX_WORKERS = 4 * (os.cpu_count() or 1)


@dataclass(frozen=True)
class Threads:
    """Episodes played in threads of this process, `concurrency` at a time, each by a policy
    made for it (`policy(spec, task_id, seed)`): a language model, whose work is waiting on an
    endpoint. An episode that raises `infrastructure` (the endpoint failed past its retries) is
    not the agent's failure: it gets no row, it is listed in `DIR/incomplete.json`, no new
    episode starts, `grade` raises `Incomplete`, and re-running the same command completes it."""

    policy: Callable[[str, str, int], Policy]
    concurrency: int
    infrastructure: type[BaseException]

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= 64:
            raise ValueError(f"concurrency must lie in 1..64, got {self.concurrency}")


class Incomplete(RuntimeError):
    """Some episodes could not be graded for a reason outside the agent (see `Threads`)."""

    def __init__(self, failed: list[dict], path: Path):
        super().__init__(f"{len(failed)} episode(s) not graded ({failed[0]['error']}): listed "
                         f"in {path}; re-run the same command to complete them")
        self.failed = failed


# The policies a worker process has made, by spec and the hash of what the spec loads: a model
# file replaced between two runs of one process is loaded afresh, never taken from here.
_POLICIES: dict = {}


@dataclass(frozen=True)
class Chunk:
    """A unit of parallel work as it travels to a worker process or a Ray task: its jobs, the
    tasks they play (by id) and how they are played, and never the split. A private split is
    made from its master seed, which stays in the grader's process: a Ray worker (another
    machine's, on a cluster) gets the tasks of the chunks it grades, no more (their fields are
    draws of the split's generator, though: a node is trusted with the split, docs/trust.md).
    `faults`, `probe`, `costs` and `guard` are `RunConfig`'s, which `grade_row` reads."""

    jobs: tuple[tuple[str, str, int], ...]
    tasks: dict[str, Task]
    names: dict[str, str]  # a policy's spec -> the name its rows carry
    inputs: dict[str, str]  # a policy's spec -> the hash of what it loads (`input_identity`)
    faults: FaultProfile
    probe: str
    costs: Costs
    guard: bool
    sandbox: bool
    trust_pickles: bool

    @classmethod
    def of(cls, config: RunConfig, jobs: list, inputs: dict) -> "Chunk":
        corpus = config.corpus
        return cls(tuple(jobs), {t: corpus.task(t) for t in dict.fromkeys(j[1] for j in jobs)},
                   {spec: config.name(spec) for spec in config.policies}, inputs,
                   config.faults, config.probe, config.costs, config.guard, config.sandbox,
                   config.trust_pickles)


def _run_chunk(chunk: Chunk) -> tuple[list[str], list[dict], str | None]:
    """One chunk of jobs, run in a worker: the sealed lines in job order, and the error that
    stopped the chunk, if any (the lines of the jobs done before it stay good).

    A chunk holding an outside policy's jobs is played by a fresh import of its code (a new
    fork server), and its jobs were drawn at random from the whole run (`_grade_locked`), so
    nothing a fork server could count or keep reaches another chunk, and a chunk's place says
    nothing of its jobs."""
    jobs, inputs = chunk.jobs, chunk.inputs
    outside = any(PolicySpec.parse(spec).kind == "outside" for spec in {job[0] for job in jobs})
    done: dict[int, tuple[str, dict]] = {}
    error = None
    for i in range(len(jobs)):
        spec, task_id, seed = jobs[i]
        try:
            cached = (spec, inputs.get(spec), chunk.sandbox, chunk.trust_pickles)
            policy = _POLICIES.get(cached)
            if policy is None:
                policy = make_policy(spec, sandbox=chunk.sandbox,
                                     allow_pickle=chunk.trust_pickles)
                if isinstance(policy, ExternalPolicy) and policy.digest != inputs[spec]:
                    raise PolicyLoadError(f"{spec} could not be loaded: its file changed after "
                                          "the run pinned its hash")
                _POLICIES[cached] = policy
            row = grade_row(policy, chunk.names[spec], chunk.tasks[task_id], seed, chunk)
        except PolicyLoadError as exc:  # the code, not a case: no task to name
            error = str(exc)
            break
        except Exception as exc:  # any failure of a policy, in its own words, located
            what = str(exc) if isinstance(exc, PolicyError) else f"{type(exc).__name__}: {exc}"
            error = f"policy {spec!r} failed on task {task_id} seed {seed}: {what}"
            break
        done[i] = seal(row), without_calls(row)
    if outside:  # (a worker may hold a thousand policies: the reference check's plans)
        for policy in _POLICIES.values():
            if isinstance(policy, ExternalPolicy):
                policy.new_chunk()
    ordered = [done[i] for i in sorted(done)]
    return [line for line, _ in ordered], [row for _, row in ordered], error


def _close_external() -> None:
    """Outside policies get a fresh process for every run."""
    for k in [k for k, p in _POLICIES.items() if isinstance(p, ExternalPolicy)]:
        _POLICIES.pop(k).close()


def _run_chunk_alone(chunk: Chunk) -> tuple[list[str], list[dict], str | None]:
    """A chunk in a long-lived Ray worker: outside policies' processes do not outlive it."""
    try:
        return _run_chunk(chunk)
    finally:
        _close_external()


def _in_processes(config: RunConfig, todo: list, inputs: dict, workers: int, backend: str,
                  nodes: list[str] | None) -> Iterator[tuple[int, list, list, str | None, list]]:
    """Chunks of `CHUNK` jobs in worker processes (`local`) or Ray tasks (`ray`, on the `nodes`
    checked), taken back in job order: (index of the chunk's first job, its lines, their rows
    without calls, the error that stopped it, [])."""
    chunks = (Chunk.of(config, todo[i:i + CHUNK], inputs) for i in range(0, len(todo), CHUNK))
    if backend == "ray":
        from eval.grading.distributed import ordered_map
        results = ordered_map(_run_chunk_alone, chunks, workers, nodes)
    elif workers == 1:
        results = map(_run_chunk, chunks)
    else:
        # A learned policy's torch may hold threads that a forked child would inherit locked:
        # such runs start their workers fresh.
        fresh = any(PolicySpec.parse(spec).learned for spec in config.policies)
        method = "fork" if sys.platform.startswith("linux") and not fresh else "spawn"
        pool = multiprocessing.get_context(method).Pool(workers)
        results = pool.imap(_run_chunk, chunks)
    try:
        for n, (lines, rows, error) in enumerate(results):
            yield n * CHUNK, lines, rows, error, []
    finally:
        if backend == "local" and workers > 1:
            pool.terminate()
            pool.join()


def _in_threads(config: RunConfig, todo: list, threads: Threads
                ) -> Iterator[tuple[int, list, list, str | None, list]]:
    """One job a thread, `threads.concurrency` in flight, as they complete: (its index, [its
    line, or None if the infrastructure failed it], [its row without calls, or None], None,
    [the failure, if any]). After a failure no new job starts; those in flight finish."""
    corpus = config.corpus

    def episode(index: int) -> tuple[str, dict]:
        spec, task_id, seed = todo[index]
        row = grade_row(threads.policy(spec, task_id, seed), config.name(spec),
                        corpus.task(task_id), seed, config)
        return seal(row), without_calls(row)

    pending: dict = {}
    submitted = 0
    failed = False
    with ThreadPoolExecutor(threads.concurrency) as pool:
        while pending or (submitted < len(todo) and not failed):
            while len(pending) < threads.concurrency and submitted < len(todo) and not failed:
                pending[pool.submit(episode, submitted)] = submitted
                submitted += 1
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                index = pending.pop(future)
                try:
                    line, row = future.result()
                    yield index, [line], [row], None, []
                except threads.infrastructure as exc:
                    _, task_id, seed = todo[index]
                    failed = True
                    yield index, [None], [None], None, [{"task_id": task_id, "seed": seed,
                                                         "error": str(exc)}]


# ------------------------------------------------------------------------------- grading
def grade(config: RunConfig, out: Path, workers: int = 1, progress: bool = True,
          desc: str = "grading", backend: str | Threads = "local",
          manifest: dict | None = None) -> list[dict]:
    """Run every missing job of `config` into `out/episodes.jsonl`; return the config's rows,
    `without_calls` (`read_rows` reads them whole).

    `backend` says where episodes run: `local` worker processes (`workers` of them), `ray`
    tasks (`eval/grading/distributed.py`), or `Threads` (a model behind an endpoint); the file is the
    same. `manifest` adds fields the run must keep across resumes (a model's settings)."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must lie in 1..{MAX_WORKERS} (4 per core: more processes "
                         f"than that only add overhead), got {workers}")
    if isinstance(backend, str):
        if backend not in BACKENDS:
            raise ValueError(f"--backend: unknown backend {backend!r}; valid: "
                             f"{', '.join(BACKENDS)}")
        if backend == "ray":  # (a private split's Ray tasks get their cases, not its seed)
            from eval.grading.distributed import require_ray
            require_ray()  # Ray missing: an error now, before anything is written
    outside = [s for s in config.policies if PolicySpec.parse(s).kind == "outside"]
    if outside:  # which sandbox the outside policies were graded in, proven before any case
        manifest = {**(manifest or {}), "sandbox": self_test() if config.sandbox
                    else "off"}
    if isinstance(backend, str):
        # Fail now, not in a worker: an outside policy's code is loaded once, then let go; a
        # model is checked here, once a run, against the arm it is graded on (`make_policy`).
        for spec in config.policies:
            policy = make_policy(spec, sandbox=config.sandbox,
                                 allow_pickle=config.trust_pickles, probe=config.probe)
            if isinstance(policy, ExternalPolicy):
                policy.preflight()
    inputs = {spec: digest for spec in config.policies
              if (digest := input_identity(spec)) is not None}
    nodes = None
    if backend == "ray":  # every node checked first, and the cases graded there alone
        from eval.grading.distributed import check_nodes
        nodes, proved = check_nodes(inputs, input_identity, bool(outside) and config.sandbox)
        if proved is not None:  # what each node's sandbox proved, by host name
            manifest["sandbox_nodes"] = proved
    runfolder.prepare(out)
    with runfolder.lock(out):
        runfolder.pin(out, {**config.manifest(), **(manifest or {})}, inputs)
        return _grade_locked(config, out, workers, progress, desc, backend, inputs, nodes)


def _grade_locked(config: RunConfig, out: Path, workers: int, progress: bool, desc: str,
                  backend: str | Threads, inputs: dict, nodes: list[str] | None) -> list[dict]:
    path = out / runfolder.ROWS
    rows = runfolder.rows_read_last(path)
    if rows is None:
        runfolder.repair(path)
        rows = [without_calls(row) for row in read_rows(path)]
    jobs = config.jobs()
    wanted = jobs if config.names is None else [config.named(job) for job in jobs]
    done = {key(row) for row in rows}
    todo = [job for job, name in zip(jobs, wanted) if name not in done]
    if any(PolicySpec.parse(spec).kind == "outside" for spec in config.policies):
        # The job order is public (policy, task, seed in corpus order; the private split's
        # tasks grouped by archetype), and a case can count the cases before it (a fork
        # server's memory, process ids, times). So the jobs of a run with outside code are
        # played in an order drawn from the operating system's entropy and never recorded:
        # a count then tells a case its place in a random order, nothing of its job. Lines are
        # written as they complete, then put in job order below, so the file is the same.
        random.SystemRandom().shuffle(todo)
    error = None
    failed: list[dict] = []
    if todo:
        bar = _progress(len(todo), desc, progress)
        tokens = [0, 0]
        if isinstance(backend, Threads):
            events = _in_threads(config, todo, backend)
        else:
            events = _in_processes(config, todo, inputs, workers, backend, nodes)
        appender = OrderedAppender(path)
        waiting: dict[str, dict] = {}  # a line's row, until the line is written
        try:
            for start, lines, graded, error, failures in events:
                waiting.update((line, row) for line, row in zip(lines, graded) if line)
                for line in appender.extend(start, lines):
                    row = waiting.pop(line)
                    rows.append(row)
                    if "tokens_in" in row:
                        tokens[0] += row["tokens_in"]
                        tokens[1] += row["tokens_out"]
                        bar.set_postfix_str(f"tokens in {tokens[0]:,} out {tokens[1]:,}")
                bar.update(len(lines))
                failed += failures
                if error is not None:
                    break
        finally:
            events.close()
            appender.close()
            _close_external()
            bar.close()
    incomplete = out / "incomplete.json"
    if failed:
        runfolder.write_atomic(incomplete, json.dumps({"episodes": failed}, indent=2) + "\n")
        raise Incomplete(failed, incomplete)
    if incomplete.exists():
        incomplete.unlink()
    if error is not None:
        raise PolicyError(f"{error} (the {len(rows)} episodes recorded in {path} stay valid)")
    keys = [key(row) for row in rows]
    if runfolder.keep_in_order(path, keys, wanted):
        runfolder.forget_rows()  # `rows` are no longer in the file's order
        rank = {job: i for i, job in enumerate(wanted)}
        rows, keys = zip(*sorted(zip(rows, keys), key=lambda pair: rank.get(pair[1], -1))) \
            if rows else ((), ())
    else:
        runfolder.remember_rows(path, rows)
    wanted_set = set(wanted)
    rows = [row for row, k in zip(rows, keys) if k in wanted_set]
    if len(rows) != len(wanted_set):
        raise ValueError(f"{path} holds {len(rows)} of the {len(wanted_set)} episodes of this "
                         "run (duplicated or foreign lines?)")
    return rows


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
