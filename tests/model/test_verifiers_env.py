"""The `finality-gym-env` verifiers environment (`eval/models/hub/`) end to end, in
`.venv-verifiers` only (`make verifiers`; `make test` runs this file there, and the main suite
skips it): vf-eval (the command, and the library call it wraps, `run_eval`) plays the 48 cases of
the stratified subset against the scripted chat server (`tests/model/chat_server.py`, a real HTTP
server on 127.0.0.1) behind verifiers' own interception proxy, once as the finality gate and once
as a reckless policy (`eager`, with a reply without a call and a call of an unknown tool), and
each rollout's row, reward and metrics are the grader's for the same calls: the arm's own run of
the same server (`python -m eval model`'s `grade_model`) gives the same rows, episode by episode.
`python -m eval import-verifiers` of each run gives those rows, and an edited run is refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers", reason="the verifiers environment's test runs in "
                    ".venv-verifiers (make verifiers)")

import eval.models.arm as model_arm  # noqa: E402
import eval.models.import_verifiers as import_verifiers  # noqa: E402
from agents.model import ModelConfig  # noqa: E402
from eval.grading.runfolder import read_rows  # noqa: E402
from eval.models import verifiers_cases as vc  # noqa: E402

from tests.model import vf_traces  # noqa: E402
from tests.model.chat_server import ChatServer, misbehave_schedule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SEED_FILE = ROOT / "docs" / "leaderboard" / "docs_master_seed"  # published: a demonstration seed
VF_EVAL = Path(sys.executable).with_name("vf-eval")
MODEL, KEY = "scripted-model", "test-key"
RECKLESS = {0: "text_only", 1: "unknown_tool"}


def vf_eval_command(server: ChatServer, out: Path, *more: str) -> Path:
    """`vf-eval finality-gym-env` against `server`, as a user runs it; its run folder."""
    done = subprocess.run(
        [str(VF_EVAL), vc.ENV_ID, "-m", MODEL, "--client.base-url", server.base_url,
         "--client.api-key-var", "TEST_KEY", "--env.agent.runtime.type", "subprocess",
         "--sampling.temperature", "0", "--no-push", "--no-rich", "-o", str(out), *more],
        cwd=ROOT, env={**os.environ, "TEST_KEY": KEY}, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return _run_folder(out)


def eval_config(server: ChatServer, out: Path, taskset: dict | None = None,
                key_var: str = "TEST_KEY"):
    from verifiers.v1.configs.cli.eval import EvalConfig
    return EvalConfig.model_validate({
        "env": {"taskset": {"id": vc.ENV_ID, **(taskset or {})},
                "agent": {"runtime": {"type": "subprocess"}}},
        "model": MODEL, "client": {"base_url": server.base_url, "api_key_var": key_var},
        "sampling": {"temperature": 0.0}, "push": False, "rich": None, "output_dir": str(out)})


def run_eval(server: ChatServer, out: Path, taskset: dict | None = None,
             key_var: str = "TEST_KEY") -> Path:
    """The library call vf-eval wraps, in this process."""
    from verifiers.v1.cli.eval.runner import run_eval as run
    asyncio.run(run(eval_config(server, out, taskset, key_var)))
    return _run_folder(out)


def served(server: ChatServer, taskset: dict) -> list:
    """The episodes of the taskset's cases played as a trainer's env server plays them
    (`verifiers.v1.serve.server.EnvServer`): each task rebuilt from its data alone, as it came
    over the wire (the server never calls the taskset's `load`), then run in a slot."""
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.utils.loaders import load_environment
    config = eval_config(server, Path("unused"), taskset)
    wire = [task.data.model_dump(mode="json") for task in load_environment(config.env).taskset]
    env = load_environment(config.env)  # the server's own, its taskset never loaded
    task_cls = type(env.taskset).task_type()

    async def play() -> list:
        ctx = ModelContext(client=config.client, model=config.model, sampling=config.sampling)
        async with env.serving():
            return [await env.run_slot(env.slots(task_cls(task_cls.data_type().model_validate(
                data), env.config.taskset.task))[0], ctx, None) for data in wire]

    return asyncio.run(play())


def _run_folder(out: Path) -> Path:
    (folder,) = [p for p in out.iterdir() if (p / "traces.jsonl").is_file()]
    return folder


def arm_rows(server: ChatServer, out: Path, options: dict | None = None) -> dict:
    """The model arm's own run of the server on the options' cases: rows by (task, seed)."""
    cases = vc.case_set(vc.Options.of(options or {}))
    config = ModelConfig(model=MODEL, base_url=server.base_url, api_key_env="TEST_KEY",
                         timeout_s=30.0, regime=cases.options.regime)
    model_arm.grade_model(config, cases.run_config(MODEL), out, concurrency=4, progress=False)
    return {(r["task_id"], r["seed"]): r for r in read_rows(out / "episodes.jsonl")}


def traces(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "traces.jsonl").read_text().split("\n")[:-1]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("vf")
    os.environ["TEST_KEY"] = KEY
    found = {}
    with ChatServer(policy="finality_gate") as server:
        found["finality_gate"] = (vf_eval_command(server, base / "gate"),
                                  arm_rows(server, base / "gate-arm"))
        assert not server.errors
    with ChatServer(policy="eager", misbehave=misbehave_schedule(RECKLESS)) as server:
        found["eager"] = (run_eval(server, base / "eager"), arm_rows(server, base / "eager-arm"))
        vf_traces.write_run(base / "eager-written", server.base_url, {"count": 6})
        assert not server.errors
    return base, found


@pytest.mark.parametrize("policy", ["finality_gate", "eager"])
def test_each_rollout_is_the_arms_episode_rewarded_by_its_row(runs, policy):
    folder, arm = runs[1][policy]
    cases = vc.case_set(vc.Options()).by_id()
    episodes = traces(folder)
    assert len(episodes) == 48 and {e["traces"][0]["task"]["data"]["id"] for e in episodes} == (
        set(cases))
    for episode in episodes:
        assert episode["ok"] and not episode["errors"], episode["errors"]
        trace = episode["traces"][0]
        case = cases[trace["task"]["data"]["id"]]
        row = arm[(case.task_id, case.seed)]  # the arm's row: the same calls, record and counts
        assert trace["info"]["row"] == row, case
        assert trace["info"]["label"] == row["label"]
        assert trace["rewards"] == {"gap_reward": {"score": vc.reward(row), "weight": 1.0}}
        assert trace["metrics"] == vc.metrics(row)
    labels = {r["label"] for r in arm.values()}
    if policy == "eager":  # reckless: it charges twice and ships unpaid, and is told off twice
        assert "double_charge" in labels and all(r["invalid_turns"] == 2 for r in arm.values())
    else:
        assert sum(r["gap"] == 0 for r in arm.values()) >= 40


@pytest.mark.parametrize("policy", ["finality_gate", "eager"])
def test_the_import_of_a_run_gives_the_arms_rows(runs, policy):
    base, found = runs
    folder, arm = found[policy]
    summary = import_verifiers.run(folder, base / f"{policy}-imported", workers=1)
    imported = read_rows(base / f"{policy}-imported" / "episodes.jsonl")
    assert {(r["task_id"], r["seed"]): r for r in imported} == arm and len(imported) == 48
    assert summary["self_reported"] is True


def test_an_edited_run_is_refused(runs, tmp_path):
    folder, _ = runs[1]["eager"]
    edited = tmp_path / "run"
    (edited / import_verifiers.CONFIG).parent.mkdir(parents=True)
    (edited / import_verifiers.CONFIG).write_text((folder / import_verifiers.CONFIG).read_text())
    episodes = traces(folder)  # in the order the rollouts ended
    trace = next(e["traces"][0] for e in episodes if e["traces"][0]["info"]["row"]["gap"] > 0)
    row = trace["info"]["row"]
    row["gap"], row["label"] = 0, "exact"  # as if it had been right
    trace["metrics"] = vc.metrics(row)
    (edited / "traces.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    with pytest.raises(ValueError, match="does not replay to its record"):
        import_verifiers.run(edited, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


def test_the_main_venvs_written_runs_have_vf_evals_shapes(runs):
    """`vf_traces.py` (the main venv's runs) writes what vf-eval writes, where the import reads."""
    base, found = runs
    real = {e["traces"][0]["task"]["data"]["id"]: e for e in traces(found["eager"][0])}
    for episode in traces(base / "eager-written"):
        written = episode["traces"][0]
        trace = real[written["task"]["data"]["id"]]["traces"][0]
        prompts = (trace["task"]["data"]["system_prompt"], trace["task"]["data"]["prompt"])
        assert import_verifiers.conversation(trace, prompts) == import_verifiers.conversation(
            written, prompts)
        for key in ("info", "rewards", "metrics", "stop_condition", "ok", "errors"):
            assert trace[key] == written[key], key
        # what says which run, endpoint and settings a line is of
        label = real[written["task"]["data"]["id"]]["run"]
        assert label.keys() == episode["run"].keys() and label["type"] == episode["run"]["type"]
        assert [(c["model"], c["sampling"], c["node"]) for c in trace["calls"]] == [
            (c["model"], c["sampling"], c["node"]) for c in written["calls"]]
        agent, ours = trace["agent"]["config"], written["agent"]["config"]
        assert (agent["client"]["base_url"], agent["sampling"], agent["model"]) == (
            ours["client"]["base_url"], ours["sampling"], ours["model"])
        data = trace["task"]["data"]
        assert {**data, "options": {**data["options"], "count": 6}} == {  # written with count 6
            k: written["task"]["data"].get(k, data[k]) for k in data}


def test_a_regime_is_a_taskset_option_and_an_endpoint_failure_is_no_episode(tmp_path):
    os.environ["TEST_KEY"], os.environ["WRONG_KEY"] = KEY, "not-the-key"
    options = {"count": 3, "regime": "guarded"}
    with ChatServer(policy="finality_gate") as server:
        folder = run_eval(server, tmp_path / "guarded", options)
        arm = arm_rows(server, tmp_path / "guarded-arm", options)
        refused = run_eval(server, tmp_path / "refused", {"count": 1}, key_var="WRONG_KEY")
    rows = [t["traces"][0]["info"]["row"] for t in traces(folder)]
    assert {(r["task_id"], r["seed"]): r for r in rows} == arm and len(rows) == 3
    system = traces(folder)[0]["traces"][0]["nodes"][0]["message"]["content"]
    assert system == vc.case_set(vc.Options.of(options)).prompts(vc.case_set(
        vc.Options.of(options)).cases[0])[0] != vc.case_set(vc.Options()).prompts(
        vc.case_set(vc.Options()).cases[0])[0]
    (episode,) = traces(refused)
    trace = episode["traces"][0]
    assert not episode["ok"] and "row" not in trace["info"] and not trace["rewards"]
    assert "upstream 401" in json.dumps(trace["errors"])
    with pytest.raises(ValueError, match="errored"):
        import_verifiers.run(refused, tmp_path / "out", workers=1)


def test_a_private_split_plays_as_a_trainers_env_server_plays_it_and_no_trace_holds_its_seed(
        tmp_path):
    os.environ["TEST_KEY"] = KEY
    options = {"split": "private", "master_seed_file": str(SEED_FILE), "count": 2, "seeds": 2}
    with ChatServer(policy="finality_gate") as server:
        episodes = served(server, options)
        arm = arm_rows(server, tmp_path / "arm", options)
    cases = vc.case_set(vc.Options.of(options)).by_id()
    assert len(episodes) == 4 and all(e.ok for e in episodes)
    for episode in episodes:
        trace = episode.traces[0]
        case = cases[trace.task.data.id]
        assert case.task_id.startswith("pri-")
        row = arm[(case.task_id, case.seed)]
        assert trace.info["row"] == row and trace.rewards["gap_reward"].score == vc.reward(row)
    seed = str(vc.read_master_seed(str(SEED_FILE)))
    assert not any(seed in episode.model_dump_json() for episode in episodes)


def test_a_context_overflow_mid_case_is_the_arms_lapse_and_imports(tmp_path):
    """A context too short for the longer conversations (the server refuses as vLLM does): the
    rollout is not an error, its row is the arm's lapse (`context_overflow`), and the import,
    which sees the failed exchange and no reply after it, gives that row."""
    os.environ["TEST_KEY"] = KEY
    options = {"count": 6}
    with ChatServer(policy="react", context_tokens=3200, overflow="vllm") as server:
        folder = run_eval(server, tmp_path / "short", options)
        arm = arm_rows(server, tmp_path / "short-arm", options)
    rows = {(r["task_id"], r["seed"]): r for r in (e["traces"][0]["info"]["row"]
                                                   for e in traces(folder))}
    assert rows == arm and len(rows) == 6
    lapsed = [r for r in rows.values() if r["agent_status"] == "context_overflow"]
    assert lapsed and all(r["requests"] >= 5 and r["lapsed"] for r in lapsed)  # mid-case
    rows_back, _ = import_verifiers.rows_of(folder)
    assert {(r["task_id"], r["seed"]): r for r in rows_back} == arm
