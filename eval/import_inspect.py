"""`python -m eval import-inspect LOG --out DIR`: an inspect_ai log of `eval/inspect_task.py` as a
model-arm results folder.

    python -m eval import-inspect LOG --out DIR [--workers 2]

Every scored sample of the log becomes a graded row of `DIR/episodes.jsonl` (sealed, in the
grader's job order), the scripted policies are graded on the same episodes into
`DIR/scripted/`, and the summary, report and figure are the model arm's (`eval/model_arm.py`):
the shared grader's statistics then apply to any model inspect can reach. `run.json` pins the
split, seeds, probe arm and tasks the log holds, and the model as the log names it.

A row is not taken on trust: the engine replays its recorded calls on its task and seed
(`finality_gym.episode.replay`), and a row whose record is not what they give is refused, as is
a log of another task, a sample that errored (an infrastructure failure, never an agent's: run
inspect again with `--retry`, or import the log once it is complete), or a folder already
holding another import. The model keeps the name inspect gives it (`--model
openai-api/local/m` imports as `model:local/m`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from agents.model import prompt_hash
from finality_gym import load_corpus
from finality_gym.episode import replay
from finality_gym.tools import tools_hash

from . import runfolder
from .grader import RunConfig
from .model_arm import finish, model_table
from .runfolder import read_rows, seal

TASK = "finality"
SCORER = "engine_record"


def rows_of(log_path: Path) -> tuple[list[dict], dict]:
    """The log's graded rows, each checked by replaying its calls, and its task arguments."""
    try:
        from inspect_ai.log import read_eval_log
    except ImportError as exc:
        raise ImportError("import-inspect needs the 'inspect' extra: pip install -e .[inspect]"
                          ) from exc
    if not log_path.is_file():
        raise ValueError(f"{log_path} is not a file")
    try:
        log = read_eval_log(str(log_path))
    except Exception as exc:  # inspect's own reader: a file that is not one of its logs
        raise ValueError(f"{log_path} is not an inspect log ({type(exc).__name__}: {exc})"
                         ) from None
    if log.eval.task.split("/")[-1] != TASK:
        raise ValueError(f"{log_path} is a log of inspect task {log.eval.task!r}, not of "
                         f"{TASK!r} (eval/inspect_task.py)")
    errored = [s.id for s in log.samples or [] if s.error is not None]
    if errored:
        raise ValueError(f"{log_path}: {len(errored)} sample(s) errored ({errored[0]}, ...): "
                         "an infrastructure failure is never graded; re-run them with inspect "
                         "(`inspect eval-retry`) and import the complete log")
    args = log.eval.task_args or {}
    split, probe = args.get("split", "public"), args.get("probe", "full")
    corpus = load_corpus(split)
    rows = []
    for sample in log.samples or []:
        score = (sample.scores or {}).get(SCORER)
        if score is None or "row" not in (score.metadata or {}):
            raise ValueError(f"{log_path}: sample {sample.id} has no {SCORER} score")
        row = score.metadata["row"]
        if row.get("probe") != probe:
            raise ValueError(f"{log_path}: sample {sample.id} was played in probe arm "
                             f"{row.get('probe')!r}, the task says {probe!r}")
        episode = replay(corpus.task(row["task_id"]), row["seed"], row["calls"], row["lapsed"],
                         probe=probe)
        record = episode.record().to_dict()
        differ = [k for k in record if record[k] != row.get(k)]
        if differ:
            raise ValueError(f"{log_path}: sample {sample.id}'s row does not replay to its "
                             f"record ({', '.join(differ)} differ): the log was edited or is "
                             "not this engine's")
        rows.append(row)
    if not rows:
        raise ValueError(f"{log_path} holds no scored sample")
    return rows, {"split": split, "probe": probe, "model": log.eval.model,
                  "log": str(log_path), "task_args": args}


def run(log_path: Path, out: Path, workers: int = 2) -> dict:
    rows, info = rows_of(log_path)
    names = {r["policy"] for r in rows}
    if len(names) != 1:
        raise ValueError(f"{log_path}: rows of several models ({sorted(names)})")
    corpus = load_corpus(info["split"])
    present = {r["task_id"] for r in rows}
    tasks = tuple(t.task_id for t in corpus.tasks if t.task_id in present)
    seeds = tuple(sorted({r["seed"] for r in rows}))
    rc = RunConfig((names.pop(),), split=info["split"], seeds=seeds, probe=info["probe"],
                   tasks=tasks)
    by_job = {(r["policy"], r["task_id"], r["seed"]): r for r in rows}
    missing = [job for job in rc.jobs() if job not in by_job]
    if missing:
        raise ValueError(f"{log_path}: the log holds {len(rows)} of the {len(rc.jobs())} "
                         f"(task, seed) cases of its tasks and seeds (missing: {missing[0][1]} "
                         f"seed {missing[0][2]}, ...); import a log of every seed of each task")
    model = {"name": rc.policies[0].removeprefix("model:"), "base_url": f"inspect_ai: "
             f"{info['model']}", "served_as": [info["model"]], "via": "inspect_ai",
             "log": info["log"], "task_args": info["task_args"], "sent": {},
             "learned": [], "prompt_sha": prompt_hash(), "tools_sha": tools_hash()}
    runfolder.prepare(out)
    with runfolder.lock(out):
        runfolder.pin(out, {**rc.manifest(), "model": {k: model[k] for k in (
            "name", "via", "prompt_sha", "tools_sha")}})
        path = out / runfolder.ROWS
        existing = read_rows(path) if path.exists() else []
        wanted = [by_job[job] for job in rc.jobs()]
        if existing and existing != wanted:
            raise ValueError(f"{out} already holds other rows of this model; import into "
                             "another --out folder")
        if not existing:
            runfolder.write_atomic(path, "".join(seal(r) + "\n" for r in wanted))
    summary = finish(out, wanted, rc, model, workers)
    print(model_table(summary))
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=Path, metavar="LOG",
                        help="an inspect log of eval/inspect_task.py (.eval or .json)")
    parser.add_argument("--out", type=Path, required=True, help="the results folder to write")
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes for the scripted policies")
    parser.set_defaults(no_progress=True)


def main(args: argparse.Namespace) -> int:
    run(args.log, args.out, args.workers)
    print(f"imported {args.log} into {args.out}")
    return 0

