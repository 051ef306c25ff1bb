"""`python -m eval import-verifiers RUN_DIR --out DIR`: a `vf-eval` run of the `finality-gym-env`
environment (`eval/models/hub/`) as a model-arm results folder, marked self-reported.

    python -m eval import-verifiers OUTPUTS/finality-gym-env--MODEL--...  --out DIR [--workers 2]

`RUN_DIR` is the folder vf-eval writes a run into (`traces.jsonl`, `configs/resolved/eval.json`).
Every rollout becomes a graded row of `DIR/episodes.jsonl` (sealed, in the grader's job order),
the scripted policies are graded on the same episodes into `DIR/scripted/`, and the summary,
report and figure are the model arm's (`eval/models/arm.py`). It runs in the main venv: it
imports no verifiers, only the environment's own logic (`eval/models/verifiers_cases.py`).

What is checked before anything is written (a run that fails a check is refused with one line
naming the rollout, exit 2, `--out` untouched):

- The cases: the resolved config's taskset options (`env.taskset`) declare the run's cases
  (`verifiers_cases.case_set`, with vf-eval's `--select.limit` N its first N in the taskset's
  keyed order; any other selection, a shuffle, a skip, an include or exclude, chooses cases
  and is refused, as is more than one rollout a case), and the run must hold each declared
  case once and nothing else: each rollout's opaque id is mapped back by recomputing the ids
  of every declared case. A run of another taskset or harness, or of the private split (whose
  grades are never self-reported: `eval verify` re-runs the model), is refused.
- The rollouts: an errored, timed-out or stopped rollout (an infrastructure failure, or a
  verifiers limit that cut the episode) is refused, never graded. Every line must be of the run
  its resolved config describes: the run's name (`run.name`) and one run id on every line, the
  config's endpoint (`client.base_url`) and sampling in each rollout's agent, the config's model
  requested in every call, and each call's sampling what the harness sent with the config's
  `sampling` imposed (`sent`): rollouts of several runs merged, or calls at other settings, are
  refused.
- The calls: each rollout's conversation (its `nodes`, one chain; the last tool results, never
  sent, are not in it) is played again by the model arm's own policy (`verifiers_cases.replay`):
  its assistant messages are the model's replies, in order, the usage and failed attempts of
  each are the proxy's records of the exchange (`calls`), and the policy must send exactly the
  logged messages. The row in `info` must be what that gives (its calls, record, label,
  requests, retries, invalid turns, tokens, status), and so must the reward and the metrics,
  each compared as JSON (`import_checks.same`: `false` is not `0`, `120.0` not `120`); the row
  written is the replay's. A case that ends in a failed exchange claims a context overflow
  (a lapse), which is refused on a request shorter than one the run's endpoint answered
  (`import_checks.check_overflows`: one model behind one endpoint has one context window).

What cannot be checked is that the model wrote the conversation: a traces file is the
submitter's word. So an import is **self-reported**: `run.json` says `"self_reported": true` and
pins the traces file's sha256 and the taskset options (and the regime where it is not `open`,
as the model arm pins it), and the summary and report say so.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from agents.model import ModelConfig, prompt_hash
from finality_gym.corpus import PRIVATE
from finality_gym.tools import tools_hash

from eval.grading.runfolder import json_lines
from eval.models import verifiers_cases as vc
from eval.models.arm import import_options, write_imported
from eval.models.import_checks import Requests, check_overflows, check_row, same
from eval.models.import_checks import short as _short

TRACES, CONFIG = "traces.jsonl", Path("configs", "resolved", "eval.json")
TASK_TYPE, REWARD = "FinalityTask", "gap_reward"
COMPLETED = "agent_completed"  # the stop condition of a rollout whose harness returned



def declared(config: dict) -> tuple[vc.CaseSet, tuple[vc.Case, ...], dict]:
    """The run's case set, the cases its config declares, and its taskset options as given."""
    taskset = (config.get("env") or {}).get("taskset") or {}
    if str(taskset.get("id", "")).split("/")[-1].split("@")[0].replace("-", "_").lower() != (
            vc.ENV_ID.replace("-", "_")):
        raise ValueError(f"a run of taskset {_short(taskset.get('id'))}, not of {vc.ENV_ID}")
    harness = ((config["env"].get("agent") or {}).get("harness") or {}).get("id")
    if harness not in (None, taskset["id"]):
        raise ValueError(f"a run under harness {_short(harness)}: only the environment's own "
                         "harness plays the arm's episode")
    if config.get("num_rollouts", 1) != 1:
        raise ValueError(f"{config['num_rollouts']} rollouts a case: the environment's seeds "
                         "(--env.taskset.seeds) give a case's other episodes; import a run of one "
                         "rollout a case")
    select = config.get("select") or {}
    chosen = [k for k in ("include", "exclude") if any((select.get(k) or {}).values())]
    chosen += [k for k in ("shuffle", "skip") if select.get(k)]
    if chosen:
        raise ValueError(f"it was run on chosen cases (--select.{chosen[0]}): a run of chosen "
                         "cases is not imported; run every declared case, or a first N")
    options = vc.Options.of(taskset)
    if options.split == PRIVATE:
        raise ValueError("a run of the private split: its grade is never self-reported (an "
                         "operator grades it with `python -m eval verify`, re-running the model)")
    cases = vc.case_set(options)
    limit = select.get("limit")
    if limit is not None and (type(limit) is not int or limit < 1):
        raise ValueError(f"its --select.limit {_short(limit)} is not a count")
    return cases, cases.cases[:limit], {k: taskset[k] for k in taskset if k not in ("task",)}


def conversation(trace: dict, prompts: tuple[str, str]
                 ) -> tuple[list[dict], list[vc.Turn], bool]:
    """A trace's messages (its nodes, which must be one chain), its model replies with their
    usage and attempts (from the proxy's `calls`), and whether its last exchange failed. A
    conversation whose first request failed (a context too short for it) keeps no node: its
    messages are then the case's `prompts` (system prompt, brief)."""
    nodes = trace.get("nodes")
    calls = trace.get("calls") or []
    if nodes == [] and calls and all(c.get("node") is None for c in calls):
        return [{"role": "system", "content": prompts[0]},
                {"role": "user", "content": prompts[1]}], [], True
    if not isinstance(nodes, list) or not nodes:
        raise ValueError("it holds no conversation")
    for number, node in enumerate(nodes):
        if not isinstance(node, dict) or node.get("parent") != (number - 1 if number else None):
            raise ValueError(f"its conversation is not one chain (node {number})")
        if node.get("sampled") is not (_role(node) == "assistant"):
            raise ValueError(f"its node {number} ({_short(_role(node))}) is not what the model "
                             "sampled, or the reverse")
    replies = [n for n, node in enumerate(nodes) if _role(node) == "assistant"]
    turns, failed, at = {}, 0, []
    for call in calls:
        if call.get("node") is None:
            failed += 1
            continue
        at.append(call["node"])
        turns[call["node"]] = _turn(nodes[call["node"]]["message"], call, failed)
        failed = 0
    if at != replies:
        raise ValueError(f"its model exchanges ({_short(at)}) are not its replies ({replies})")
    return [node["message"] for node in nodes], [turns[n] for n in replies], failed > 0


def _role(node) -> str | None:
    message = node.get("message") if isinstance(node, dict) else None
    return message.get("role") if isinstance(message, dict) else None


def _turn(message: dict, call: dict, failed: int) -> vc.Turn:
    """A reply as the provider's Chat Completions body held it: its usage with the cached
    prompt tokens added back (verifiers' `Usage` counts prompt tokens without them)."""
    wire = {"role": "assistant", "content": message.get("content")}
    calls = [{"id": c.get("id"), "type": "function",
              "function": {"name": c.get("name"), "arguments": c.get("arguments")}}
             for c in message.get("tool_calls") or []]
    if calls:
        wire["tool_calls"] = calls
    usage, raw = call.get("usage"), {}
    if usage is not None:
        cached, reasoning = usage.get("cached_input_tokens"), usage.get("reasoning_tokens")
        prompt = usage.get("prompt_tokens")
        raw = {"prompt_tokens": prompt + cached if isinstance(prompt, int) and isinstance(
                   cached, int) and not isinstance(cached, bool) else prompt,
               "completion_tokens": usage.get("completion_tokens"),
               "prompt_tokens_details": {"cached_tokens": cached},
               "completion_tokens_details": {"reasoning_tokens": reasoning}}
    return vc.Turn(wire, raw, failed + 1, call.get("model"), call.get("finish_reason"))


@dataclass
class Run:
    """What the run's resolved config says each of its lines is: of its model, its run (`name`;
    `id`, the one its first line names), its endpoint and its sampling."""

    model: str
    name: str
    base_url: object
    sampling: object
    id: str | None = None

    @classmethod
    def of(cls, config: dict) -> Run:
        model, name = config.get("model"), (config.get("run") or {}).get("name")
        if not isinstance(model, str) or not model:
            raise ValueError("its config names no model")
        if not isinstance(name, str) or not name:
            raise ValueError("its config names no run (run.name)")
        return cls(model, name, (config.get("client") or {}).get("base_url"),
                   config.get("sampling"))

    def sent(self) -> dict:
        return sent(self.sampling if isinstance(self.sampling, dict) else {})


def checked_row(episode, cases: vc.CaseSet, by_id: dict, run: Run
                ) -> tuple[vc.Case, dict, Requests]:
    """A rollout's case, its row (the replay's, checked against the trace's) and the lengths of
    its requests, each derived again (see the module's docstring)."""
    if not isinstance(episode, dict) or not isinstance(episode.get("traces"), list):
        raise ValueError("it is not a verifiers episode")
    traces = episode["traces"]
    errors = list(episode.get("errors") or []) + [e for t in traces if isinstance(t, dict)
                                                   for e in t.get("errors") or []]
    if episode.get("ok") is not True or errors or episode.get("is_timeout"):
        raise ValueError(f"it errored ({_short((errors or ['not ok'])[0])}): an infrastructure "
                         "failure is never graded; run it again and import a complete run")
    if len(traces) != 1 or traces[0].get("ok") is not True:
        raise ValueError(f"it holds {len(traces)} traces, not one complete trace")
    trace = traces[0]
    if trace.get("stop_condition") != COMPLETED or trace.get("is_timeout"):
        raise ValueError(f"it stopped on {_short(trace.get('stop_condition'))}, not when its "
                         "episode ended: a verifiers limit cut it (keep --env.agent.max-turns and "
                         "timeouts off; the taskset's caps are the arm's)")
    task = trace.get("task") or {}
    data = task.get("data") or {}
    case = by_id.get(data.get("id"))
    if task.get("type") != TASK_TYPE or case is None:
        raise ValueError(f"its task {_short(data.get('id'))} is not one of the {len(by_id)} "
                         "cases its config declares")
    where = f"case {case.id} (task {case.task_id}, seed {case.seed})"
    try:
        _of_run(episode, trace, run)
        row, requests = _row(trace, cases, case, run)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return case, row, requests


def _of_run(episode: dict, trace: dict, run: Run) -> None:
    """The rollout is of the run its config describes: its run's name and id, its endpoint, its
    sampling and the model each call asked for."""
    label = episode.get("run") if isinstance(episode.get("run"), dict) else {}
    if label.get("name") != run.name:
        raise ValueError(f"it is a rollout of run {_short(label.get('name'))}, not of its "
                         f"config's ({run.name}): rollouts of several runs are not imported")
    if not isinstance(label.get("id"), str) or label["id"] != (run.id or label["id"]):
        raise ValueError(f"its run id {_short(label.get('id'))} is not that of the run's other "
                         f"rollouts ({run.id}): rollouts of several runs are not imported")
    run.id = label["id"]
    agent = (trace.get("agent") or {}).get("config") or {}
    base_url = (agent.get("client") or {}).get("base_url")
    if not same(base_url, run.base_url):
        raise ValueError(f"it was played against endpoint {_short(base_url)}, not its run's "
                         f"({_short(run.base_url)})")
    if not same(agent.get("sampling"), run.sampling):
        raise ValueError(f"its agent's sampling ({_short(agent.get('sampling'))}) is not its "
                         f"run's ({_short(run.sampling)})")
    if agent.get("model") != run.model:
        raise ValueError("it was played by another model than its run's")
    for number, call in enumerate(trace.get("calls") or []):
        if not isinstance(call, dict) or call.get("model") != run.model:
            raise ValueError(f"its call {number} asked for model "
                             f"{_short(call.get('model') if isinstance(call, dict) else call)}, "
                             f"not its run's ({run.model})")


def _sampled_as_sent(calls: list, fields: dict, run: Run) -> None:
    """Each call's sampling (verifiers records the request's sampling fields) is what the harness
    sent (the policy's own `fields`, the run's temperature and max_tokens) with the run's
    `sampling` imposed: no field it did not send, none it sent otherwise."""
    expected = {**fields, **run.sent()}
    required = set(fields) | {"temperature", "max_tokens"}
    for number, call in enumerate(calls):
        sampling = call.get("sampling")
        if not (isinstance(sampling, dict) and required <= sampling.keys() <= expected.keys()
                and same(sampling, {k: expected[k] for k in sampling})):
            raise ValueError(f"its call {number} was sampled with {_short(sampling)}, not with "
                             f"what its run sent ({_short(expected)})")


def _row(trace: dict, cases: vc.CaseSet, case: vc.Case, run: Run) -> tuple[dict, Requests]:
    agent = (trace.get("agent") or {}).get("config") or {}
    harness = (agent.get("harness") or {}).get("id")
    if harness != vc.ENV_ID:
        raise ValueError(f"it was played by harness {_short(harness)}, not by the environment's "
                         "own")
    data = trace["task"]["data"]
    if not same(data.get("options"), cases.options.as_dict()):
        raise ValueError(f"its task's options ({_short(data.get('options'))}) are not its run's")
    if (data.get("system_prompt"), data.get("prompt")) != cases.prompts(case):
        raise ValueError("its prompts are not the case's")
    info = trace.get("info") or {}
    row = info.get("row")
    if not isinstance(row, dict) or not same(info.get("env_version"), vc.ENV_VERSION):
        raise ValueError(f"its info holds no row of environment version {vc.ENV_VERSION}")
    messages, turns, overflowed = conversation(trace, cases.prompts(case))
    try:
        derived, chat = vc.replay(cases, case, run.model, messages, turns, overflowed)
    except Exception as exc:  # the arm's own code refused it: say why
        raise ValueError(f"its conversation does not play ({type(exc).__name__}: "
                         f"{_short(str(exc), 300)})") from None
    _sampled_as_sent(trace.get("calls") or [], chat.fields, run)
    check_row(derived, row, "run")
    rewards = {REWARD: {"score": vc.reward(derived), "weight": 1.0}}
    if not (same(trace.get("rewards"), rewards) and same(trace.get("metrics"),
            vc.metrics(derived)) and same(info.get("label"), derived["label"])):
        raise ValueError(f"its reward and metrics ({_short(trace.get('rewards'))}, "
                         f"{_short(trace.get('metrics'))}) are not its row's ({_short(rewards)}, "
                         f"{_short(vc.metrics(derived))})")
    return derived, chat.requests


def rows_of(run_dir: Path) -> tuple[list[dict], dict]:
    """The run's rows, each derived again from its conversation, in the grader's job order, and
    what the run declares; ValueError on any disagreement."""
    path, config_path = run_dir / TRACES, run_dir / CONFIG
    if not path.is_file() or not config_path.is_file():
        raise ValueError(f"{run_dir} is not a vf-eval run folder (it needs {TRACES} and {CONFIG})")
    data = path.read_bytes()  # the bytes hashed are the bytes read
    try:
        config = json.loads(config_path.read_text())
        cases, wanted, taskset = declared(config)
        run = Run.of(config)
    except ValueError as exc:
        raise ValueError(f"{run_dir}: {exc}") from None
    except Exception as exc:  # a file no vf-eval run writes: refused, never a traceback
        raise ValueError(f"{run_dir}: its {CONFIG} is not a vf-eval config ({type(exc).__name__}"
                         f": {_short(str(exc))})") from None
    found = _read(path, data, cases, {c.id: c for c in wanted}, run)
    missing = [c for c in wanted if c.id not in found]
    if missing:
        raise ValueError(f"{path}: it holds {len(found)} of the {len(wanted)} cases its config "
                         f"declares; missing case {missing[0].id} (task {missing[0].task_id}, "
                         f"seed {missing[0].seed}){', ...' if len(missing) > 1 else ''}")
    chosen = {c.task_id for c in wanted}
    tasks = tuple(t for t in cases.tasks if t in chosen)  # in corpus order, as the arm's
    seeds = tuple(sorted({c.seed for c in wanted}))
    if len(tasks) * len(seeds) != len(wanted):
        raise ValueError(f"{run_dir}: its --select.limit cuts a task's seeds; use a limit of "
                         "whole tasks")
    rc = cases.run_config(run.model, tasks, seeds)
    order = {(c.task_id, c.seed): found[c.id] for c in wanted}
    rows = [order[(task_id, seed)] for _, task_id, seed in rc.jobs()]
    return rows, {"rc": rc, "options": cases.options, "taskset": taskset, "model": run.model,
                  "sha256": hashlib.sha256(data).hexdigest(), "limit": (config.get(
                      "select") or {}).get("limit"), "base_url": run.base_url,
                  "sent": run.sent()}


def _read(path: Path, data: bytes, cases: vc.CaseSet, by_id: dict, run: Run) -> dict:
    """Each line's row by its case's id, checked (`checked_row`), then the run's claimed
    context overflows against the requests its endpoint answered (`check_overflows`)."""
    found: dict = {}
    requests = []
    # split on newlines alone (a reply may hold a raw U+2028); a last line without its newline
    # is read too: a run is read whole
    whole = data if data.endswith(b"\n") or not data else data + b"\n"
    for number, line in enumerate(json_lines(whole), 1):
        where = f"{path}:{number}"
        try:
            case, row, asked = checked_row(json.loads(line), cases, by_id, run)
        except ValueError as exc:  # json's own errors are ValueErrors too
            raise ValueError(f"{where}: {exc}") from None
        except Exception as exc:  # a line no run of the environment writes
            raise ValueError(f"{where}: not a rollout of {vc.ENV_ID} ({type(exc).__name__}: "
                             f"{_short(str(exc))})") from None
        if case.id in found:
            raise ValueError(f"{where}: case {case.id} appears twice: a run holds each case once")
        found[case.id] = row
        requests.append((f"line {number}, case {case.id} (task {case.task_id}, seed "
                         f"{case.seed})", asked))
    try:
        check_overflows(requests)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return found


def sent(sampling: dict) -> dict:
    """What every request carried besides the conversation: the harness's temperature and
    max_tokens (the run's, else the arm's defaults, `ModelConfig`'s), with the run's other
    sampling fields, which the verifiers proxy imposes on each request."""
    given = {k: v for k, v in sampling.items() if v is not None}
    return {**ModelConfig(model="-", base_url="http://verifiers.invalid").request_params(),
            **given}


def run(run_dir: Path, out: Path, workers: int = 2) -> dict:
    rows, info = rows_of(run_dir)
    rc, options = info["rc"], info["options"]
    verifiers = {"log_sha256": info["sha256"], "task_args": info["taskset"],
                 "task_version": vc.ENV_VERSION, "model": info["model"], "epochs": 1,
                 "limit": info["limit"]}
    regime = {} if options.regime == "open" else {"regime": options.regime}  # as the arm pins it
    model = {"name": info["model"], "base_url": f"verifiers: {info['base_url']}",
             "served_as": [info["model"]], "via": "verifiers", "log": str(run_dir / TRACES),
             **verifiers, "sent": info["sent"], "learned": [], **regime,
             "prompt_sha": prompt_hash(options.regime), "tools_sha": tools_hash()}
    pinned = {"model": {k: model[k] for k in ("name", "via", *regime, "prompt_sha",
                                              "tools_sha")},
              "self_reported": True, "verifiers": verifiers}
    return write_imported(out, rows, rc, model, pinned, workers)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    import_options(parser, "RUN_DIR",
                   "a vf-eval run folder of finality-gym-env (traces.jsonl, configs/)")


def main(args: argparse.Namespace) -> int:
    run(args.run_dir, args.out, args.workers)
    print(f"imported {args.run_dir} into {args.out} (self-reported: the model was not re-run)")
    return 0
