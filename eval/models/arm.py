"""The model arm: a language model acts through tool calls and is graded by the shared grader.

`python -m eval model --model NAME --base-url URL ...` grades one model (`agents.model`) on the
stratified subset (or the whole split) and, on exactly the same tasks and seeds, the nine
scripted policies; the comparisons use only the episodes the model has a row for.

A run folder holds `run.json` (the manifest: the split, tasks, seeds, probe arm, the model, its
sampling settings and caps, the hashes of the system prompt and of the tool table; a re-run
under any other one is refused), `episodes.jsonl` (the model's graded rows: the headline's
fields plus `requests`, `replayed`, `retries`, `invalid_turns`, `tokens_in`, `tokens_out`,
`tokens_reasoning` and `tokens_cached` (where the server reports them, else 0),
`agent_status`), `transcripts/TASK__seedS.jsonl` (every request and response, each file at most
`--max-transcript-bytes`), `scripted/` (the scripted policies' grading on the same tasks), and
once every episode is graded, `summary.json`, `report.md` and `model_arm.png`.

Episodes run in threads (`--concurrency`) through the shared grader's own loop (`grade` with
`Threads`); rows are written in job order as they complete, so
the file is the same whatever the concurrency. An episode whose endpoint failed past every retry
gets no row: it is listed in `incomplete.json`, no new episode is started, the command exits
non-zero, and re-running completes it (replaying its recorded turns without a request).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np

from agents.model import (
    Budget,
    Endpoint,
    InfrastructureError,
    ModelConfig,
    ModelPolicy,
    prompt_hash,
)
from agents.registry import GATE, HEADLINE
from finality_gym import Corpus, load_corpus
from finality_gym.tools import tools_hash

import eval.grading.runfolder as runfolder
from eval.grading.grader import MAX_WORKERS, RunConfig, Threads, grade
from eval.grading.runfolder import (SUMMARY, TRANSCRIPTS, json_lines, read_rows, transcript_name,
                                    write_atomic)
from eval.reports.figures import save_figure, subplots
from eval.reports.format import interval, md_name, money, share, table
from eval.reports.report import report_markdown
from eval.stats.summary import summarize

SUBSET_SINGLETONS = 4      # per archetype
REGIME_WORDS = {"open": " (the model decides)",
                "procedure": " (a written operating procedure in the prompt)",
                "guarded": " (every episode behind the guard, finality_gym/guard.py: an "
                           "irreversible call the evidence does not support is refused)"}
SUBSET_PENDING_PAIRS = 4   # pending_settle / pending_fail twin pairs
SUBSET_UNRESOLVABLE_PAIRS = 2


def _spread(items: list, k: int) -> list:
    """k items evenly spaced over the list, its first and last included."""
    if len(items) <= k:
        return list(items)
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)]


def stratified_subset(split: str | Corpus) -> tuple[str, ...]:
    """The model arm's tasks: for every archetype 4 singletons, plus 4 pending twin pairs and 2
    unresolvable twin pairs, whole; each group's members evenly spaced in corpus order. 48 tasks
    (42 independent units) on either split (or a private corpus, which `eval verify` passes
    itself): small enough for a free quota."""
    corpus = load_corpus(split) if isinstance(split, str) else split
    singles: dict[str, list] = {}
    pairs: dict[str, list] = {}
    for unit in corpus.units:
        group = singles if len(unit) == 1 else pairs
        group.setdefault(unit[0].archetype, []).append(unit)
    chosen = [u for units in singles.values() for u in _spread(units, SUBSET_SINGLETONS)]
    chosen += _spread(pairs["pending_settle"], SUBSET_PENDING_PAIRS)
    chosen += _spread(pairs["unresolvable"], SUBSET_UNRESOLVABLE_PAIRS)
    ids = {t.task_id for unit in chosen for t in unit}
    return tuple(t.task_id for t in corpus.tasks if t.task_id in ids)


def run_config(config: ModelConfig, split: str, subset: str, seeds: int, probe: str) -> RunConfig:
    """The model's cases; the `guarded` regime plays every episode behind the guard."""
    if subset not in ("stratified", "all"):
        raise ValueError(f"subset must be 'stratified' or 'all', got {subset!r}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    tasks = stratified_subset(split) if subset == "stratified" else None
    return RunConfig((f"model:{config.model}",), split=split, seeds=tuple(range(seeds)),
                     probe=probe, tasks=tasks, guard=config.regime == "guarded")


def manifest_fields(config: ModelConfig, sent: dict | None = None,
                    learned: list[str] | None = None) -> dict:
    """What the run pins of the model (a resume under any other is refused): the model, its
    sampling settings and caps (`--param`, `--no-param` included), exactly what every request
    carried besides the conversation (`sent`: the preflight's adaptation of them, `learned`:
    why), and the hashes of the system prompt and the tool table; not the endpoint, the key's
    variable or the retry schedule, which decide no row. The regime is pinned where it is not
    `open` (a folder from before regimes resumes as it was; the prompt's hash pins it too)."""
    data = asdict(config)
    if data["regime"] == "open":
        del data["regime"]
    for name in ("base_url", "api_key_env", "timeout_s", "max_retries", "backoff_s",
                 "backoff_max_s", "max_cost",  # a larger budget may complete a run
                 "max_response_bytes", "max_transcript_bytes"):  # and so may larger caps
        del data[name]
    data["params"] = {key: json.loads(text) for key, text in config.params}
    data["no_params"] = list(config.no_params)
    return {**data, "sent": config.request_params() if sent is None else sent,
            "learned": learned or [], "prompt_sha": prompt_hash(config.regime),
            "tools_sha": tools_hash()}


def pinned_model(out: Path) -> dict | None:
    """The model fields a run folder pinned, if it has a manifest."""
    try:
        return json.loads((out / "run.json").read_text()).get("model")
    except (OSError, ValueError):
        return None


def read_transcript(path: Path) -> list[dict]:
    """A transcript's complete lines, without changing the file (a torn last line is left
    out)."""
    data = path.read_bytes()
    lines = []
    for number, line in enumerate(json_lines(data), 1):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number} is not a transcript line ({exc}); move the file "
                             "away to replay that episode live") from None
    return lines


class Transcript:
    """One episode's requests and responses, a JSON line per turn, written as they happen
    (`transcripts/TASK__seedS.jsonl`; only the run holding the folder's lock opens one).

    A line: `turn`, `request_sha` (of the whole request), `new_messages` (the messages added
    since the previous request: the conversation is their concatenation), `params`, `response`
    (the body as received), `usage`, `latency_s`, `attempts`, `errors` (the transient failures
    before it), `served_model`. `recorded(turn, sha)` returns a line to replay, or None and cuts
    the file there, so what follows is live.

    The file may grow to `max_bytes` (`--max-transcript-bytes`): `room()` is what a response
    may still take (the endpoint cuts one that is larger, an endpoint failure, retried), and a
    line that would carry the file past the cap is not written: either way the episode ends in
    an `InfrastructureError` (no row; the same command with a larger cap completes it).
    """

    def __init__(self, path: Path, max_bytes: int | None = None):
        self.path = path
        self.max_bytes = max_bytes
        self.lines = read_transcript(path) if path.exists() else []
        if path.exists() and not path.read_bytes().endswith(b"\n") and path.stat().st_size:
            self._rewrite()  # a torn last line (a killed run) is dropped
        self.size = path.stat().st_size if path.exists() else 0

    def room(self) -> int | None:
        """The bytes the file has left under its cap (None: no cap); none left is the
        episode's infrastructure error."""
        if self.max_bytes is None:
            return None
        if self.size >= self.max_bytes:
            raise self._full(0)
        return self.max_bytes - self.size

    def _full(self, adding: int) -> InfrastructureError:
        return InfrastructureError(
            f"the episode's transcript would pass the --max-transcript-bytes cap of "
            f"{self.max_bytes:,} bytes ({self.size:,} written"
            + (f", a {adding:,}-byte turn to add" if adding else "") + "); re-run with a larger "
            "cap to complete the episode")

    def recorded(self, turn: int, request_sha: str) -> dict | None:
        if turn < len(self.lines) and self.lines[turn]["request_sha"] == request_sha:
            return self.lines[turn]
        if turn < len(self.lines):
            del self.lines[turn:]
            self._rewrite()
        return None

    def append(self, line: dict) -> None:
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        if self.max_bytes is not None and self.size + len(data) > self.max_bytes:
            raise self._full(len(data))
        self.lines.append(line)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            f.write(data)
        self.size += len(data)

    def _rewrite(self) -> None:
        data = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in self.lines)
        write_atomic(self.path, data)
        self.size = len(data.encode())


def grade_model(config: ModelConfig, rc: RunConfig, out: Path, concurrency: int = 1,
                progress: bool = True) -> list[dict]:
    """Grade the model's missing episodes into `out` through the shared grader, one episode a
    thread; return its rows. The endpoint is checked before any episode starts, and before the
    folder is pinned (a failed preflight leaves a new folder without a manifest); a complete
    run needs no endpoint."""
    endpoint: list[Endpoint] = []
    path = out / "episodes.jsonl"
    done = {(r["task_id"], r["seed"]) for r in read_rows(path)} if path.exists() else set()
    if any(case not in done for case in rc.cases()):
        endpoint.append(_preflight(config))
        fields = manifest_fields(config, endpoint[0].params, endpoint[0].learned)
    else:  # nothing to ask the endpoint: what was sent is what the folder pinned
        pinned = pinned_model(out) or {}
        fields = manifest_fields(config, pinned.get("sent"), pinned.get("learned"))

    budget = None
    if config.max_cost is not None:  # what the graded rows cost counts against it
        rows = read_rows(path) if path.exists() else []
        budget = Budget(config.max_cost, sum(r.get("cost_microusd", 0) for r in rows))

    def policy(spec: str, task_id: str, seed: int) -> ModelPolicy:
        transcript = Transcript(out / TRANSCRIPTS / transcript_name(task_id, seed),
                                config.max_transcript_bytes)
        return ModelPolicy(config, endpoint[0], transcript, budget)

    return grade(rc, out, progress=progress, desc="model",
                 backend=Threads(policy, concurrency, InfrastructureError),
                 manifest={"model": fields})


def _preflight(config: ModelConfig) -> Endpoint:
    endpoint = Endpoint(config)
    served = endpoint.preflight()
    print(f"model {config.model} (served as {served}) at {config.base_url}", flush=True)
    for line in endpoint.learned:
        print(f"  the endpoint's terms: {line}", flush=True)
    return endpoint


def arm_figures(rows: list[dict]) -> dict:
    """The paper's model-arm shares for one policy's rows."""
    n = len(rows)
    used = lambda tool: sum(1 for r in rows if r.get("tool_counts", {}).get(tool)) / n  # noqa: E731
    figures = {"episodes": n, "probe_used": round(used("probe_processor"), 6),
               "waited": round(used("wait"), 6),
               "premature": round(sum(r["premature"] for r in rows) / n, 6)}
    if "tokens_in" in rows[0]:
        figures["tokens_in_per_episode"] = round(float(np.mean([r["tokens_in"] for r in rows])), 1)
        figures["tokens_out_per_episode"] = round(float(np.mean([r["tokens_out"] for r in rows])), 1)
        figures["cost_per_episode_usd"] = round(
            float(np.mean([r.get("cost_microusd", 0) for r in rows])) / 1e6, 6)
        figures["cost_usd"] = round(sum(r.get("cost_microusd", 0) for r in rows) / 1e6, 6)
        for key in ("tokens_reasoning", "tokens_cached"):  # rows from before these were kept
            figures[f"{key}_per_episode"] = round(float(np.mean([r.get(key, 0) for r in rows])), 1)
        figures["requests_per_episode"] = round(float(np.mean([r["requests"] for r in rows])), 2)
        figures["retries"] = int(sum(r["retries"] for r in rows))
        figures["invalid_turns"] = int(sum(r["invalid_turns"] for r in rows))
        statuses: dict[str, int] = {}
        for r in rows:
            statuses[r["agent_status"]] = statuses.get(r["agent_status"], 0) + 1
        figures["agent_status"] = statuses
    return figures


def run(out: Path, config: ModelConfig, split: str = "public", subset: str = "stratified",
        seeds: int = 1, probe: str = "full", concurrency: int = 1, workers: int = 2,
        progress: bool = True, backend: str = "local") -> dict:
    """Grade the model and the scripted policies (these `workers` at a time on `backend`); write
    the summary, the report and the figure. While some episode is still ungraded (its endpoint
    failed) this raises `eval.grading.grader.Incomplete` and writes no summary."""
    if not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers must lie in 1..{MAX_WORKERS}, got {workers}")
    rc = run_config(config, split, subset, seeds, probe)
    print(f"split {split}: {len({t for _, t, _ in rc.jobs()})} tasks ({subset}), seeds "
          f"{list(rc.seeds)}, probe arm {probe}", flush=True)
    rows = grade_model(config, rc, out, concurrency, progress)
    model = {"name": config.model, "base_url": config.base_url,
             "served_as": sorted({r["served_model"] for r in _transcript_lines(out)
                                  if r.get("served_model")}),
             **(pinned_model(out) or manifest_fields(config))}
    return finish(out, rows, rc, model, workers, backend)


def finish(out: Path, rows: list[dict], rc: RunConfig, model: dict, workers: int = 2,
           backend: str = "local", self_reported: bool = False) -> dict:
    """The scripted policies graded on the model's episodes (into `out/scripted`), then the
    summary (`model`: what it says of the model), the report and the figure. `self_reported`:
    the rows are the submitter's word (an imported inspect log, `eval/models/import_inspect.py`), which
    the summary and the report say."""
    name = rc.policies[0]
    scripted_config = RunConfig(HEADLINE, split=rc.split, seeds=rc.seeds, probe=rc.probe,
                                tasks=rc.tasks)
    scripted = grade(scripted_config, out / "scripted", workers=workers, progress=False,
                     backend=backend)
    attempted = {(r["task_id"], r["seed"]) for r in rows}
    scripted = [r for r in scripted if (r["task_id"], r["seed"]) in attempted]
    policies = [name, *HEADLINE]
    summary = summarize(rows + scripted, rc.corpus, policies, list(rc.seeds), baseline=GATE)
    summary["probe"] = rc.probe
    summary["model"] = model
    if self_reported:
        summary["self_reported"] = True
    by = {p: [r for r in rows + scripted if r["policy"] == p] for p in policies}
    summary["model_arm"] = {p: arm_figures(by[p]) for p in policies}
    (out / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    (out / "report.md").write_text(model_report(summary))
    figure(summary, out / "model_arm.png")
    print(model_table(summary))
    return summary


def write_imported(out: Path, rows: list[dict], rc: RunConfig, model: dict, pinned: dict,
                   workers: int = 2) -> dict:
    """An import's rows (an inspect log's, a vf-eval run's: `eval/models/import_*.py`) as a
    self-reported model-arm folder: `run.json` pins the run's config and `pinned` (the model's
    fields and the source's), the rows are sealed in the grader's job order (a folder holding
    other rows is refused), then `finish` as for a run of the arm."""
    runfolder.prepare(out)
    with runfolder.lock(out):
        runfolder.pin(out, {**rc.manifest(), **pinned})
        path = out / runfolder.ROWS
        existing = read_rows(path) if path.exists() else []
        if existing and existing != rows:
            raise ValueError(f"{out} already holds other rows of this model; import into "
                             "another --out folder")
        if not existing:
            runfolder.write_atomic(path, "".join(runfolder.seal(r) + "\n" for r in rows))
    return finish(out, rows, rc, model, workers, self_reported=True)


def import_options(parser, source: str, what: str) -> None:
    """The command line of an import: its source (`LOG`, `RUN_DIR`), `--out`, `--workers`."""
    parser.add_argument(source.lower(), type=Path, metavar=source, help=what)
    parser.add_argument("--out", type=Path, required=True, help="the results folder to write")
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes for the scripted policies")
    parser.set_defaults(no_progress=True)


def _transcript_lines(out: Path):
    for path in sorted((out / "transcripts").glob("*.jsonl")):
        yield from read_transcript(path)


def model_table(summary: dict) -> str:
    pols, arm = summary["policies"], summary["model_arm"]
    rows = []
    for name, p in pols.items():
        vs = p["vs_baseline"]
        rows.append([md_name(name, cell=True), share(p["exact"]),
                     f"{money(p['mean_gap'])} {interval(p['mean_gap_ci'])}",
                     f"{money(vs['mean_gap_diff'])} {interval(vs['mean_gap_diff_ci'])}",
                     f"{money(p['paired']['settle'])} / {money(p['paired']['fail'])}",
                     share(arm[name]["premature"]), share(arm[name]["probe_used"]),
                     share(arm[name]["waited"])])
    return table(["policy", "exact", "mean gap $ [95% CI]", f"gap - {GATE} $ [95% CI]",
                  "paired settle / fail $", "premature", "used the probe", "waited"], rows)


def model_report(summary: dict) -> str:
    m = summary["model"]
    arm = summary["model_arm"][f"model:{m['name']}"]
    lines = [f"# Model arm: {md_name(m['name'])}", "",
             f"Served as {', '.join(map(md_name, m['served_as'])) or '?'} at "
             f"{md_name(m['base_url'])}; every request carried "
             f"{md_name(json.dumps(m.get('sent', {}), sort_keys=True))} besides the "
             f"conversation, system prompt `{m['prompt_sha']}`, tools `{m['tools_sha']}`. Probe "
             f"arm `{summary['probe']}`, regime `{m.get('regime', 'open')}`"
             f"{REGIME_WORDS[m.get('regime', 'open')]}. The scripted policies are graded on "
             f"exactly the episodes the model was (never behind the guard).", "",
             *[f"- The endpoint's terms, learned at preflight: {_learned(line)}." for line in
               m.get("learned", [])], *([""] if m.get("learned") else []),
             *_self_reported(summary), model_table(summary), "",
             f"Per episode: {arm['requests_per_episode']} requests, "
             f"{arm['tokens_in_per_episode']:,} tokens in ({arm['tokens_cached_per_episode']:,} "
             f"cached), {arm['tokens_out_per_episode']:,} out ("
             f"{arm['tokens_reasoning_per_episode']:,} reasoning); cost ${arm['cost_usd']:.4f} in "
             f"all, ${arm['cost_per_episode_usd']:.6f} an episode (at the prices given; 0 "
             f"without); {arm['retries']} retried requests and {arm['invalid_turns']} invalid "
             f"turns in all; agent status {arm['agent_status']}.", ""]
    return "\n".join(lines) + "\n" + report_markdown(summary, "All statistics")


def _self_reported(summary: dict) -> list[str]:
    """The report's paragraph on an imported inspect log or verifiers run: what was checked, and
    what is its own word."""
    if not summary.get("self_reported"):
        return []
    m = summary["model"]
    limit = m.get("limit")
    verifiers = m.get("via") == "verifiers"
    cut = (f"vf-eval's `-n {limit}` (its first {limit} cases)" if verifiers else
           f"inspect's `--limit {limit}` (its first {limit} samples)")
    cases = (f"; the {'run' if verifiers else 'log'} declares "
             f"{'taskset options' if verifiers else 'task arguments'} "
             f"{md_name(json.dumps(m.get('task_args', {}), sort_keys=True))}, "
             f"{m.get('epochs', 1)} epoch(s)" + (f" and {cut}" if limit else "")
             + ", and holds each of their cases once")
    source = ("a `verifiers` run (vf-eval's traces, sha256" if verifiers
              else "an inspect_ai log (sha256")
    return [f"**Self-reported**: imported from {source} "
            f"`{m.get('log_sha256', '?')}`, task version {md_name(str(m.get('task_version')))}"
            f"{cases}); the calls were replayed by the engine and must match the logged "
            f"conversation, but the model was not re-run: an operator who needs a verified "
            f"grade re-runs the model. The model's name ({md_name(str(m.get('model')))}), "
            f"its token counts and requests, and the caps are the log's own word.", ""]


def _learned(line: str) -> str:
    """A preflight adaptation for Markdown: its field names and the endpoint's words (which
    are the endpoint's, not ours) through `md_name`."""
    found = re.fullmatch(r"(\S+) (sent as (\S+)|not sent) \(refused: (.*)\)", line, re.S)
    if found is None:
        return md_name(line)
    field, how, replacement, detail = found.groups()
    how = f"sent as {md_name(replacement)}" if replacement else how
    return f"{md_name(field)} {how} (refused: {md_name(detail)})"


def figure(summary: dict, path: Path) -> None:
    """Mean gap with its interval for the model and every scripted policy."""
    pols = summary["policies"]
    names = sorted(pols, key=lambda n: pols[n]["mean_gap"])
    fig, ax = subplots(figsize=(7.5, 0.45 * len(names) + 1.6))
    for i, name in enumerate(names):
        p = pols[name]
        lo, hi = p["mean_gap_ci"]
        colour = "C3" if name.startswith("model:") else "C0"
        ax.errorbar(p["mean_gap"], i, xerr=[[p["mean_gap"] - lo], [hi - p["mean_gap"]]],
                    fmt="o", color=colour, capsize=3)
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlabel("mean gap ($), 95% interval over units")
    ax.set_title(f"Model arm: {summary['model']['name']} ({summary['split']}, "
                 f"{summary['episodes'] // len(names)} episodes each)", fontsize=10)
    save_figure(fig, path)
