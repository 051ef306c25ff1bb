"""The benchmark as an inspect_ai task (`eval/inspect_task.py`) and its import
(`python -m eval import-inspect`): the scripted chat server through inspect's own `openai-api`
provider, offline, against the model arm's own run of the same server on the same cases."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents.model import ModelConfig
import eval.models.import_inspect as import_inspect
import eval.models.arm as model_arm
from eval.grading.grader import RunConfig
from eval.grading.runfolder import read_rows
from finality_gym.episode import EpisodeRecord

from tests.model.chat_server import ChatServer, misbehave_schedule

inspect_ai = pytest.importorskip("inspect_ai", reason="the 'inspect' extra is not installed")
from inspect_ai import eval as inspect_eval  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CASES = 12  # the first twelve of the model arm's 48 cases
FIELDS = [*EpisodeRecord._fields, "label", "calls", "requests", "invalid_turns",
          "agent_status"]
# The scripted model answers its second reply without a tool call and calls a tool that does
# not exist in its fourth: a reminder and an invalid call, answered as the arm answers them.
MISBEHAVE = {1: "text_only", 3: "unknown_tool"}


def rows_by_case(rows):
    return {(r["task_id"], r["seed"]): {k: r[k] for k in FIELDS} for r in rows}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("inspect")
    cases = model_arm.stratified_subset("public")[:CASES]
    os.environ["TEST_KEY"] = "test-key"
    with ChatServer(policy="react", misbehave=misbehave_schedule(MISBEHAVE)) as server:
        config = ModelConfig(model="scripted-model", base_url=server.base_url,
                             api_key_env="TEST_KEY", timeout_s=30.0)
        model_arm.grade_model(config, RunConfig(("model:scripted-model",), seeds=(0,),
                                                tasks=cases),
                              base / "arm", concurrency=2, progress=False)
        arm = read_rows(base / "arm" / "episodes.jsonl")  # whole, with their calls
        os.environ["LOCAL_BASE_URL"], os.environ["LOCAL_API_KEY"] = server.base_url, "test-key"
        cwd = os.getcwd()
        os.chdir(ROOT)  # inspect resolves the task file relative to the working directory
        try:
            # the base URL given, not only its variable: inspect keeps a model by its arguments,
            # and one made for another module's server (gone) would be used again
            logs = inspect_eval("eval/inspect_task.py", model="openai-api/local/scripted-model",
                                model_base_url=server.base_url,
                                log_dir=str(base / "logs"), log_format="json", limit=CASES,
                                display="none", max_connections=2, max_retries=2)
        finally:
            os.chdir(cwd)
    assert logs[0].status == "success", logs[0].error
    return base, arm, Path(logs[0].location)


def test_inspect_plays_the_arms_conversation_and_the_import_equals_the_arms_run(runs):
    base, arm, log = runs
    summary = import_inspect.run(log, base / "imported", workers=1)
    imported = read_rows(base / "imported" / "episodes.jsonl")
    assert len(imported) == CASES
    assert rows_by_case(imported) == rows_by_case(arm)
    assert all(r["invalid_turns"] == 2 for r in imported)  # the reminder and the invalid call
    # and the scripted react that the server plays, on the same episodes, to the record
    scripted = read_rows(base / "imported" / "scripted" / "episodes.jsonl")
    react = {(r["task_id"], r["seed"]): {k: r[k] for k in EpisodeRecord._fields if k not in (
             "tool_counts",)} for r in scripted if r["policy"] == "react"}
    assert {case: {k: row[k] for k in react[case]} for case, row in
            rows_by_case(imported).items()} == react
    # the model as inspect names it: openai-api/local/scripted-model
    assert {r["policy"] for r in imported} == {"model:local/scripted-model"}
    assert summary["policies"]["model:local/scripted-model"]["mean_gap"] == (
        summary["policies"]["react"]["mean_gap"])
    pinned = json.loads((base / "imported" / "run.json").read_text())
    assert pinned["model"]["via"] == "inspect_ai" and len(pinned["tasks"]) == CASES
    # the submitter's word, said so (tests/model/test_inspect_forgery.py: what is checked of it)
    assert pinned["self_reported"] is True and summary["self_reported"] is True
    # inspect's own log holds the conversation: the reminder and the invalid call's answer
    sample = json.loads(log.read_text())["samples"][0]
    texts = [m.get("content") for m in sample["messages"]]
    assert any(isinstance(t, str) and t.startswith("No tool was called") for t in texts)
    assert any(isinstance(t, str) and '"invalid call: unknown tool' in t for t in texts)
    assert sample["scores"]["engine_record"]["value"]["gap"] == sample["scores"][
        "engine_record"]["metadata"]["row"]["gap"] / 100


def test_an_edited_log_is_refused_and_nothing_is_written(runs, tmp_path):
    _, _, log = runs
    data = json.loads(log.read_text())
    row = data["samples"][3]["scores"]["engine_record"]["metadata"]["row"]
    row["gap"] -= 100  # a better score than the calls give
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="does not replay to its record"):
        import_inspect.run(edited, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()
    data["samples"][3]["scores"]["engine_record"]["metadata"]["row"]["gap"] += 100
    data["samples"][5]["error"] = {"message": "connection refused", "traceback": "",
                                   "traceback_ansi": ""}
    edited.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="errored"):
        import_inspect.run(edited, tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()
