"""`python -m eval import-inspect LOG --out DIR`: an inspect_ai log of `eval/inspect_task.py` as a
model-arm results folder, marked self-reported.

    python -m eval import-inspect LOG --out DIR [--workers 2]

Every scored sample of the log becomes a graded row of `DIR/episodes.jsonl` (sealed, in the
grader's job order), the scripted policies are graded on the same episodes into
`DIR/scripted/`, and the summary, report and figure are the model arm's (`eval/models/arm.py`):
the shared grader's statistics then apply to any model inspect can reach.

What is checked, against the task's own code (`eval/inspect_task.py`), before anything is
written (a log that fails any check is refused with one line naming the sample, and `--out` is
left untouched):

- The cases: the log's task arguments (`task_args`: split, subset, seeds, probe, caps) and
  inspect's `--epochs` and `--limit` declare its samples (the task's own `dataset`, its first N
  with a limit; `--sample-id` and a shuffled limit are refused: they choose cases), and the log
  must hold every declared (sample, epoch) exactly once, and nothing else. Epoch e of a sample
  is the seed the task plays for it (`episode_seed`: with `-T seeds=1`, epoch k is seed k - 1),
  so an `--epochs N` log imports as N x seeds seeds, never collapsed.
- The calls: each sample's conversation (its messages) is played again by the task's own code
  (`replay_conversation`: its assistant messages are the model's replies, in order, and the
  task's policy parses their tool calls, answers invalid ones, reminds, and applies the caps as
  it did), the engine replays the calls that gives, and the conversation the task keeps for
  those replies must be the logged one (system prompt, brief, every tool result, reminder and
  invalid-call answer). The row is then what that gives: a row whose calls are not its
  conversation's tool calls, or whose record, lapse, requests, invalid turns or status are not
  what they give, is refused, each value compared as JSON (`import_checks.same`: `false` is not
  `0`, `120.0` not `120`); the row written is the replay's. A conversation that ends where the
  case asks for another reply claims a context overflow (a lapse), which is refused on a
  request shorter than one the log's model answered (`import_checks.check_overflows`: one model
  behind one endpoint has one context window).
- An errored sample (an infrastructure failure, never an agent's: run inspect again with
  `inspect eval-retry`), a log of another task, and a folder already holding another import are
  refused.

What is not checked, and cannot be: that the model wrote the conversation. A log is the
submitter's word; an inspect log is easily written by hand or by inspect's own functions. So an
import is **self-reported**: `run.json` says `"self_reported": true` and pins the log's sha256
and its task arguments as logged, the summary says `self_reported`, and the report says that
the model was not re-run (an operator who needs a verified grade re-runs the model). The token
counts (checked as non-negative integers; they are counted once, at a conversation's last
reply, for the token cap), the model's name (as inspect names it: `--model
openai-api/local/m` imports as `model:local/m`), the caps (the task arguments) and the task
version are the log's own word, recorded as logged.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
from pathlib import Path

from agents.model import prompt_hash
from finality_gym import load_corpus
from finality_gym.tools import tools_hash

from eval.grading.grader import MAX_SEEDS, RunConfig
from eval.models.arm import import_options, model_table, write_imported
from eval.models.import_checks import check_overflows, check_row, same
from eval.models.import_checks import short as _short

TASK = "finality"
SCORER = "engine_record"
TOKENS = ("tokens_in", "tokens_out", "tokens_reasoning", "tokens_cached")
FORMATS = {".eval": "eval", ".json": "json"}


def _inspect():
    """inspect_ai's log reader and the task's module (which imports inspect_ai)."""
    try:
        from inspect_ai.log import read_eval_log

        import eval.models.inspect_task as inspect_task
    except ImportError as exc:
        raise ImportError("import-inspect needs the 'inspect' extra: pip install -e .[inspect]"
                          ) from exc
    return read_eval_log, inspect_task



def _same_message(logged, played) -> bool:
    """A logged message is the one the task keeps: the very reply it was given, or a message
    of the task's (system prompt, brief, tool result, reminder) with the same content."""
    if logged.role != played.role:
        return False
    if logged.role == "assistant":
        return logged is played
    return (logged.content == played.content
            and getattr(logged, "tool_call_id", None) == getattr(played, "tool_call_id", None)
            and getattr(logged, "function", None) == getattr(played, "function", None)
            and getattr(logged, "error", None) is None)


def _said(message) -> str:
    return "nothing" if message is None else f"{message.role} {_short(message.text, 60)!r}"


def _messages(sample, version) -> list:
    """The sample's conversation; a log of task version 0 kept the last reply of a case its
    context overflow ended twice (the second copy, the same message, is dropped)."""
    messages = list(sample.messages or [])
    replies = [m for m in messages if m.role == "assistant"]
    if (version == 0 and len(replies) >= 2 and messages[-1] is replies[-1]
            and replies[-1].id is not None and replies[-1].id == replies[-2].id):
        messages.pop()
    return messages


def _limited(samples: list, config) -> tuple[list, str | None]:
    """The declared samples under inspect's `--limit` (its first N), or a refusal of what
    chooses cases (`--sample-id`, a range, a shuffled limit)."""
    if config.sample_id is not None:
        raise ValueError(f"it was run on chosen samples (--sample-id {_short(config.sample_id)})"
                         ": a log of chosen cases is not imported; run the whole subset")
    limit = config.limit
    if limit is None:
        return samples, None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"its --limit {_short(limit)} is not a count of first samples (a range "
                         "chooses cases: run the whole subset, or a first N)")
    if config.sample_shuffle not in (None, False):
        raise ValueError("its --limit took samples of a shuffled dataset (--sample-shuffle): "
                         "a chance choice of cases is not imported")
    return samples[:limit], f"the first {min(limit, len(samples))} of its {len(samples)} samples"


def rows_of(log_path: Path) -> tuple[list[dict], dict]:
    """The log's graded rows, each derived again from its conversation by the task's own code,
    and what the log declares (see the module's docstring): ValueError on any disagreement."""
    read_eval_log, inspect_task = _inspect()
    if not log_path.is_file():
        raise ValueError(f"{log_path} is not a file")
    fmt = FORMATS.get(log_path.suffix)
    if fmt is None:
        raise ValueError(f"{log_path} is not an inspect log (.eval or .json)")
    data = log_path.read_bytes()  # the bytes hashed are the bytes read
    try:
        log = read_eval_log(io.BytesIO(data), format=fmt, resolve_attachments=True)
    except Exception as exc:  # inspect's own reader: a file that is not one of its logs
        raise ValueError(f"{log_path} is not an inspect log ({type(exc).__name__}: "
                         f"{_short(str(exc), 300)})") from None
    try:
        return _rows(log, log_path, hashlib.sha256(data).hexdigest(), inspect_task)
    except ValueError as exc:
        raise ValueError(f"{log_path}: {exc}") from None
    except Exception as exc:  # a log no run of the task writes: refused, never a traceback
        raise ValueError(f"{log_path}: not a log of eval/inspect_task.py ({type(exc).__name__}:"
                         f" {_short(str(exc), 300)})") from None


def _rows(log, log_path: Path, sha256: str, inspect_task) -> tuple[list[dict], dict]:
    if log.eval.task.split("/")[-1] != TASK:
        raise ValueError(f"a log of inspect task {log.eval.task!r}, not of {TASK!r} "
                         "(eval/inspect_task.py)")
    samples = list(log.samples or [])
    errored = [s.id for s in samples if s.error is not None]
    if errored:
        raise ValueError(f"{len(errored)} sample(s) errored ({errored[0]}, ...): an "
                         "infrastructure failure is never graded; re-run them with inspect "
                         "(`inspect eval-retry`) and import the complete log")
    logged_args = log.eval.task_args or {}
    try:
        args = inspect_task.task_arguments(**logged_args)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"its task arguments are not the task's ({exc})") from None
    epochs = log.eval.config.epochs or 1
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"its epochs ({epochs!r}) are not a count")
    if args["seeds"] * epochs > MAX_SEEDS:
        raise ValueError(f"its {args['seeds']} seed(s) x {epochs} epoch(s) are more than the "
                         f"{MAX_SEEDS} seeds a run may hold")
    declared, limited = _limited(inspect_task.dataset(args), log.eval.config)
    cases = {(s.id, epoch): (s, inspect_task.episode_seed(s.metadata["seed"], epoch,
                                                          args["seeds"]))
             for epoch in range(1, epochs + 1) for s in declared}
    version = log.eval.task_version
    caps = {cap: args[cap] for cap in inspect_task.CAPS}
    seen: set = set()
    rows, requests = [], []
    for sample in samples:
        key = (sample.id, sample.epoch)
        where = f"sample {sample.id} epoch {sample.epoch}"
        if key in seen:
            raise ValueError(f"{where} appears twice: a log holds each sample once an epoch "
                             "(the log was edited)")
        seen.add(key)
        if key not in cases:
            raise ValueError(f"{where} is not one of the {len(cases)} samples its task "
                             f"arguments and epochs ({epochs}) declare")
        declared_sample, seed = cases[key]
        row, asked = _row(sample, declared_sample.metadata, seed, where, caps, version,
                          inspect_task)
        rows.append(row)
        requests.append((f"sample {sample.id} (task {row['task_id']}, epoch {sample.epoch})",
                         asked))
    missing = [key for key in cases if key not in seen]
    if missing:
        raise ValueError(
            f"it holds {len(seen)} of the {len(cases)} samples its task arguments "
            f"({', '.join(f'{k}={args[k]}' for k in ('split', 'subset', 'seeds'))}) and epochs "
            f"({epochs}) declare{f' ({limited})' if limited else ''}; missing sample "
            f"{missing[0][0]} epoch {missing[0][1]}{', ...' if len(missing) > 1 else ''}: "
            "import a log of every declared case")
    if not rows:
        raise ValueError("it holds no scored sample")
    check_overflows(requests)
    task_ids = {r["task_id"] for r in rows}
    tasks = tuple(t.task_id for t in load_corpus(args["split"]).tasks if t.task_id in task_ids)
    seeds = tuple(sorted({r["seed"] for r in rows}))
    if len(tasks) * len(seeds) != len(rows):
        raise ValueError(f"its {len(rows)} cases are not every seed of each task ({limited}: "
                         "a limit that cuts a task's seeds); use a limit of whole tasks")
    if not isinstance(log.eval.model, str):
        raise ValueError("it names no model")
    return rows, {"split": args["split"], "probe": args["probe"], "model": log.eval.model,
                  "log": str(log_path), "task_args": logged_args, "log_sha256": sha256,
                  "task_version": version, "epochs": epochs, "limit": log.eval.config.limit,
                  "tasks": tasks, "seeds": seeds}


def _row(sample, meta: dict, seed: int, where: str, caps: dict, version, inspect_task):
    """The sample's row, checked: what its conversation gives, played again by the task (values
    compared as JSON: `import_checks.same`), and the lengths of the requests it asked."""
    got = {k: (sample.metadata or {}).get(k) for k in meta}
    if not same(got, meta):
        raise ValueError(f"{where}'s metadata ({_short(got)}) is not the task's for that "
                         f"sample ({_short(meta)})")
    score = (sample.scores or {}).get(SCORER)
    row = None if score is None else (score.metadata or {}).get("row")
    if not isinstance(row, dict):
        raise ValueError(f"{where} has no {SCORER} score")
    task_id, probe = meta["task_id"], meta["probe"]
    where = f"sample {sample.id} (task {task_id}, epoch {sample.epoch})"
    if row.get("task_id") != task_id or row.get("probe") != probe:
        raise ValueError(f"{where}: its row is of task {_short(row.get('task_id'))} in probe "
                         f"arm {_short(row.get('probe'))}, its sample of {task_id} in {probe}")
    if not same(row.get("seed"), seed):
        raise ValueError(
            f"{where}: its row played seed {_short(row.get('seed'))}, but the task plays seed "
            f"{seed} for it (epoch {sample.epoch} of seed {meta['seed']}: eval/inspect_task.py "
            "`episode_seed`); a log of the task before version 1, which played every epoch on "
            "the sample's seed, imports only with --epochs 1: run it again")
    for key in TOKENS:
        if isinstance(row.get(key), bool) or not isinstance(row.get(key), int) or row[key] < 0:
            raise ValueError(f"{where}: its row's {key} is {_short(row.get(key))}, not a "
                             "non-negative integer")
    policy = row.get("policy")
    if not isinstance(policy, str) or not policy.startswith("model:") or policy == "model:":
        raise ValueError(f"{where}: its row's policy {_short(policy)} names no model")
    from inspect_ai.model import ModelUsage
    usage = ModelUsage(input_tokens=row["tokens_in"], output_tokens=row["tokens_out"],
                       total_tokens=row["tokens_in"] + row["tokens_out"],
                       reasoning_tokens=row["tokens_reasoning"],
                       input_tokens_cache_read=row["tokens_cached"])
    messages = _messages(sample, version)
    try:
        derived, kept, requests = inspect_task.replay_conversation(
            messages, policy.removeprefix("model:"), meta["split"], task_id, seed, probe, caps,
            usage)
    except Exception as exc:  # the task's own code refused it: say where
        raise ValueError(f"{where}: its conversation does not play ({type(exc).__name__}: "
                         f"{_short(str(exc), 200)})") from None
    for number in range(max(len(messages), len(kept))):
        logged = messages[number] if number < len(messages) else None
        played = kept[number] if number < len(kept) else None
        if logged is None or played is None or not _same_message(logged, played):
            raise ValueError(
                f"{where}: its conversation is not the one the task keeps for its replies "
                f"(message {number}: the log has {_said(logged)}, the task {_said(played)})")
    derived = json.loads(json.dumps(derived))
    try:
        check_row(derived, row, "log")
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return derived, requests  # the replay's row (the same JSON as the log's): written as made


def run(log_path: Path, out: Path, workers: int = 2) -> dict:
    rows, info = rows_of(log_path)
    names = {r["policy"] for r in rows}
    if len(names) != 1:
        raise ValueError(f"{log_path}: rows of several models ({sorted(names)})")
    rc = RunConfig((names.pop(),), split=info["split"], seeds=info["seeds"], probe=info["probe"],
                   tasks=info["tasks"])
    by_job = {(r["policy"], r["task_id"], r["seed"]): r for r in rows}
    if sorted(by_job) != sorted(rc.jobs()):  # rows_of saw to it: each case once
        raise ValueError(f"{log_path}: its rows are not one per (task, seed) case")
    inspect = {"log_sha256": info["log_sha256"], "task_args": info["task_args"],
               "task_version": info["task_version"], "model": info["model"],
               "epochs": info["epochs"], "limit": info["limit"]}
    model = {"name": rc.policies[0].removeprefix("model:"), "base_url": f"inspect_ai: "
             f"{info['model']}", "served_as": [info["model"]], "via": "inspect_ai",
             "log": info["log"], **inspect, "sent": {},
             "learned": [], "prompt_sha": prompt_hash(), "tools_sha": tools_hash()}
    wanted = [by_job[job] for job in rc.jobs()]
    pinned = {"model": {k: model[k] for k in ("name", "via", "prompt_sha", "tools_sha")},
              "self_reported": True, "inspect": inspect}
    summary = write_imported(out, wanted, rc, model, pinned, workers)
    print(model_table(summary))
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    import_options(parser, "LOG", "an inspect log of eval/inspect_task.py (.eval or .json)")


def main(args: argparse.Namespace) -> int:
    run(args.log, args.out, args.workers)
    print(f"imported {args.log} into {args.out} (self-reported: the model was not re-run)")
    return 0
