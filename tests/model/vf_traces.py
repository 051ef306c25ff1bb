"""A vf-eval run folder of the `finality-gym-env` environment written without verifiers, for the
main venv's tests of `python -m eval import-verifiers` (`tests/model/test_verifiers_cases.py`). A
test helper, not a test module.

Each case of the options is played live, as the environment's harness plays it, by the model arm's
own code (`eval.models.verifiers_cases`: `ModelPolicy` over the arm's `Endpoint`, graded by
`grade_row`) against a real chat server (`tests/model/chat_server.py`); every request and reply is
recorded and written in the shapes vf-eval writes: `traces.jsonl` (an episode a line; its trace's
`nodes` one chain of the conversation, the last tool results never sent left out; `calls` the model
exchanges with verifiers' usage, whose prompt tokens leave out the cached ones, the model the proxy
asked for and the request's sampling; `info` the graded row; `rewards` and `metrics`; the agent's
endpoint and sampling; each line's `run`, its name and id), in raw UTF-8 as vf-eval writes it, and
`configs/resolved/eval.json`. `tests/model/test_verifiers_env.py` checks these shapes against a
real vf-eval run of the same server.
"""

from __future__ import annotations

import json
from pathlib import Path

from agents.model import Endpoint, ModelPolicy
from eval.grading.grader import grade_row
from eval.models import verifiers_cases as vc


class Recording:
    """The arm's endpoint, each exchange recorded: (request messages, reply body, attempts), and
    the sampling fields the requests carried (`sampling`: all but the model, messages, tools)."""

    def __init__(self, inner: Endpoint):
        self.inner, self.params, self.exchanges, self.sampling = inner, inner.params, [], {}

    def complete(self, request, rng, *, room=None):
        self.sampling = {k: v for k, v in request.items()
                         if k not in ("model", "messages", "tools")}
        body, latency, attempts, errors = self.inner.complete(request, rng, room=room)
        self.exchanges.append((list(request["messages"]), body, attempts))
        return body, latency, attempts, errors


def node_message(message: dict, names: dict) -> dict:
    """A message as a verifiers node keeps it (a tool result named by its call, from `names`:
    call id -> tool name)."""
    if message["role"] == "tool":
        name = names.get(message["tool_call_id"])
        return {**message, **({"name": name} if name is not None else {})}
    if message["role"] == "assistant":
        out = {"role": "assistant"}
        if message.get("content") is not None:
            out["content"] = message["content"]
        calls = [{"id": c["id"], "type": "function", "name": c["function"]["name"],
                  "arguments": c["function"]["arguments"]} for c in message.get("tool_calls") or []]
        return {**out, **({"tool_calls": calls} if calls else {})}
    return dict(message)


def usage(body: dict) -> dict:
    raw = body.get("usage") or {}
    cached = (raw.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"prompt_tokens": raw.get("prompt_tokens", 0) - (cached or 0),
            "completion_tokens": raw.get("completion_tokens", 0), "cached_input_tokens": cached,
            "reasoning_tokens": (raw.get("completion_tokens_details") or {}).get(
                "reasoning_tokens")}


def trace_of(cases: vc.CaseSet, case: vc.Case, recording: Recording, row: dict,
             run: dict) -> dict:
    """The trace vf-eval writes of one played case, of the run whose config is `run`: each call
    records the model the proxy asked for (the run's) and the request's sampling fields, with
    the run's `sampling` imposed."""
    exchanges = recording.exchanges
    # a failed exchange records nothing of itself: a case whose first request overflowed keeps
    # no node
    chain = [*exchanges[-1][0], exchanges[-1][1]["choices"][0]["message"]] if exchanges else []
    names = {c["id"]: c["function"]["name"] for m in chain for c in m.get("tool_calls") or []}
    nodes = [{**({"parent": n - 1} if n else {}), "message": node_message(m, names),
              "sampled": m["role"] == "assistant"} for n, m in enumerate(chain)]
    asked = {"model": run["model"], "sampling": {
        **recording.sampling, **{k: v for k, v in run["sampling"].items() if v is not None}}}
    calls = []
    for sent, reply, attempts in exchanges:
        calls += [{**asked, "node": None, "error": {"type": "ProviderError",
                                                   "message": "upstream 500"}}] * (attempts - 1)
        calls.append({**asked, "node": len(sent), "usage": usage(reply),
                      "finish_reason": reply["choices"][0].get("finish_reason")})
    if row["agent_status"] == "context_overflow":
        calls.append({**asked, "node": None, "error": {"type": "ProviderError",
                                                      "message": "upstream 400"}})
    system, brief = cases.prompts(case)
    data = {"id": case.id, "prompt": brief, "system_prompt": system,
            "options": cases.options.as_dict()}
    agent = {"model": run["model"], "harness": {"id": vc.ENV_ID},
             "client": {"base_url": run["client"]["base_url"]}, "sampling": run["sampling"]}
    return {"task": {"type": "FinalityTask", "data": data}, "agent": {"config": agent},
            "nodes": nodes, "calls": calls,
            "rewards": {"gap_reward": {"score": vc.reward(row), "weight": 1.0}},
            "metrics": vc.metrics(row), "ok": True, "errors": [], "is_timeout": False,
            "stop_condition": "agent_completed",
            "info": {"row": row, "label": row["label"], "env_version": vc.ENV_VERSION}}


def write_run(folder: Path, base_url: str, options: dict, api_key: str = "test-key",
              model: str = "scripted-model") -> Path:
    """Play every case of `options` against the server at `base_url` and write the run folder
    vf-eval would (`folder/traces.jsonl`, `folder/configs/resolved/eval.json`); returns it."""
    cases = vc.case_set(vc.Options.of(options))
    name = f"{vc.ENV_ID}--{model}--{vc.ENV_ID}--{folder.name}"
    config = {"env": {"taskset": {"task": {}, "system_prompt": None, "id": vc.ENV_ID,
                                  **cases.options.as_dict()},
                      "agent": {"harness": None, "runtime": {"type": "subprocess"}}},
              "run": {"name": name, "dir": name, "attach": None},
              "model": model, "client": {"base_url": base_url, "api_key_var": "TEST_KEY"},
              "sampling": {"temperature": 0.0, "top_p": None, "reasoning_effort": None,
                           "max_tokens": None},
              "select": {"include": {"idx": [], "ids": [], "keys": [], "names": []},
                         "exclude": {"idx": [], "ids": [], "keys": [], "names": []},
                         "shuffle": False, "seed": 0, "skip": 0, "limit": None},
              "num_rollouts": 1, "push": False}
    label = {"type": "eval", "id": f"disabled-{folder.name}", "name": name}
    lines = []
    for case in cases.cases:
        recording = Recording(endpoint := Endpoint(cases.model_config(model, base_url)))
        endpoint.client = endpoint.client.with_options(api_key=api_key)
        policy = ModelPolicy(endpoint.config, recording)
        row = grade_row(policy, policy.name, cases.corpus.task(case.task_id), case.seed,
                        cases.run_config(model))
        row = json.loads(json.dumps(row))
        trace = trace_of(cases, case, recording, row, config)
        # raw UTF-8, as vf-eval writes it (a reply's U+2028 unescaped)
        lines.append(json.dumps({"id": case.id, "env": {"id": vc.ENV_ID}, "run": label,
                                 "ok": True, "is_timeout": False, "errors": [],
                                 "traces": [trace]}, ensure_ascii=False))
    (folder / "configs" / "resolved").mkdir(parents=True, exist_ok=True)
    (folder / "traces.jsonl").write_bytes("".join(line + "\n" for line in lines).encode())
    (folder / "configs" / "resolved" / "eval.json").write_text(json.dumps(config, indent=1))
    return folder
