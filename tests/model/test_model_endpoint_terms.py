"""An endpoint's terms, through the model arm against a real HTTP server on 127.0.0.1: the
sampling fields it takes (a reasoning model's refusals learned at preflight, `--param`,
`--no-param`), what it wants back (Gemini's thought signatures; never the output-only fields),
and what its tokens cost (prices, and a budget that stops a run resumably). The arm's own
behaviour is `test_model_arm.py`'s."""

import json

import openai
import pytest

from agents import brief_for, make_policy, run_episode
from agents.model import (ConfigurationError, Endpoint, ModelConfig, ModelPolicy, brief_message,
                          returned, system_prompt)
import eval.models.arm as model_arm
from eval.__main__ import EXIT_INCOMPLETE
from eval.grading.runfolder import read_rows
from eval.models.arm import read_transcript
from finality_gym import load_corpus
from finality_gym.tools import chat_tools

from tests.model.chat_server import ChatServer
from tests.model.model_client import FAST, arm, config, key  # noqa: F401  (key: autouse)


def test_a_reasoning_model_is_graded_with_the_fields_it_takes_and_that_is_pinned(
        tmp_path, capsys):
    """It refuses max_tokens (naming max_completion_tokens) and a temperature but 1: the
    preflight learns both, every request carries what it took, run.json and the report say
    so, and its reasoning and cached tokens are counted."""
    with ChatServer(policy="finality_gate", reasoning=True) as server:
        assert arm(server, tmp_path, "--param", 'reasoning_effort="low"') == 0
        requests = server.requests
        out = capsys.readouterr().out
    pinned = json.loads((tmp_path / "run.json").read_text())["model"]
    assert pinned["sent"] == {"max_completion_tokens": 1024, "reasoning_effort": "low"}
    assert pinned["params"] == {"reasoning_effort": "low"}
    assert [line.split(" (")[0] for line in pinned["learned"]] == [
        "max_tokens sent as max_completion_tokens", "temperature not sent"]
    assert "Use 'max_completion_tokens' instead" in pinned["learned"][0]
    assert "the endpoint's terms: temperature not sent" in out
    lines = [line for path in sorted((tmp_path / "transcripts").glob("*.jsonl"))
             for line in read_transcript(path)]
    assert lines and all(line["params"] == {"model": "scripted-model", **pinned["sent"]}
                         for line in lines)
    rows = read_rows(tmp_path / "episodes.jsonl")
    corpus = load_corpus("public")
    for row in rows:  # the scripted model plays the gate: the gate's records
        want = run_episode(make_policy("finality_gate"), corpus.task(row["task_id"]), 0)
        assert (row["disposition"], row["gap"]) == (want.disposition, want.gap)
        assert row["tokens_reasoning"] == 7 * row["requests"]
        assert 0 < row["tokens_cached"] < row["tokens_in"]
    report = (tmp_path / "report.md").read_text()
    assert "learned at preflight: max_tokens sent as max_completion_tokens" in report
    # a finished run re-run asks nothing; under another field it is refused
    with ChatServer(policy="finality_gate", reasoning=True) as server:
        assert arm(server, tmp_path, "--param", 'reasoning_effort="low"') == 0
        assert server.requests == 0
        assert arm(server, tmp_path, "--param", 'reasoning_effort="high"') == 2
    assert "model" in capsys.readouterr().err
    assert requests > len(rows)


def test_no_param_keeps_a_field_out_of_every_request(tmp_path):
    with ChatServer(policy="finality_gate", reasoning=True) as server:
        assert arm(server, tmp_path, "--no-param", "temperature", "--param",
                    "max_completion_tokens=512", "--no-param", "max_tokens") == 0
    pinned = json.loads((tmp_path / "run.json").read_text())["model"]
    assert pinned["sent"] == {"max_completion_tokens": 512} and pinned["learned"] == []
    assert pinned["no_params"] == ["temperature", "max_tokens"]


@pytest.mark.parametrize("args, message", [
    (["--param", "model=\"x\""], "the harness sets model itself"),
    (["--param", "seed=seven"], "the value is not JSON"),
    (["--param", "seed"], "expected KEY=JSON"),
    (["--param", "seed=1", "--no-param", "seed"], "each field once"),
])
def test_bad_params_are_refused_before_any_request(tmp_path, capsys, args, message):
    with ChatServer(policy="finality_gate") as server:
        assert arm(server, tmp_path, *args) == 2
        assert server.requests == 0
    assert message in capsys.readouterr().err


def test_a_field_the_endpoint_refuses_outside_the_preflight_stays_a_configuration_error():
    """Only the preflight learns: a refusal it cannot map to a sampling field it sent stops the
    run as before (here, an unknown model)."""
    with ChatServer(policy="finality_gate", reasoning=True) as server:
        endpoint = Endpoint(ModelConfig(model="other", base_url=server.base_url,
                                        api_key_env="TEST_KEY", **FAST))
        with pytest.raises(ConfigurationError, match="does not exist"):
            endpoint.preflight()
        assert endpoint.learned == []


def test_gemini_thought_signatures_go_back_with_their_tool_calls(tmp_path):
    """The server refuses a history whose tool calls lack the signatures it gave them: the arm
    plays every case as the gate does, so they came back."""
    corpus = load_corpus("public")
    with ChatServer(policy="finality_gate", signatures=True) as server:
        for task_id in model_arm.stratified_subset("public")[::8]:
            task = corpus.task(task_id)
            got = run_episode(ModelPolicy(config(server)), task, 0)
            assert got == run_episode(make_policy("finality_gate"), task, 0)
        assert server.errors == [] and server.turns > 0
        # the check is real: the same history with a signature removed is refused
        client = openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0)
        brief = brief_message(brief_for(corpus.task(task_id), 0, "full"))
        messages = [{"role": "system", "content": system_prompt()},
                    {"role": "user", "content": brief}]
        first = client.chat.completions.create(model="scripted-model", messages=messages,
                                               tools=chat_tools()).choices[0].message
        call = first.model_dump(exclude_none=True)["tool_calls"][0]
        assert call["extra_content"]["google"]["thought_signature"].startswith("sig-")
        del call["extra_content"]
        with pytest.raises(openai.BadRequestError, match="thought_signature"):
            client.chat.completions.create(
                model="scripted-model", tools=chat_tools(),
                messages=messages + [{"role": "assistant", "content": None,
                                      "tool_calls": [call]},
                                     {"role": "tool", "tool_call_id": call["id"],
                                      "content": "{}"}])


def test_an_assistant_message_goes_back_as_sent_less_the_output_only_fields():
    sent = {"role": "assistant", "content": None, "refusal": None,
            "annotations": [{"type": "url_citation"}], "reasoning_content": "thinking...",
            "reasoning_details": [{"type": "reasoning.encrypted", "data": "x"}],
            "tool_calls": [{"id": "c1", "type": "function", "extra_content": {"google": {
                "thought_signature": "s"}}, "function": {"name": "wait",
                                                        "arguments": "{\"ticks\": 5}"}}]}
    back = returned(sent)
    assert back == {key: value for key, value in sent.items()
                    if key not in ("annotations", "reasoning_content")}
    assert returned({"role": "assistant", "content": "hi", "tool_calls": []}) == {
        "role": "assistant", "content": "hi"}


def test_prices_give_each_episode_its_cost_and_a_budget_stops_the_run_resumably(
        tmp_path, capsys):
    """At $2 / $8 a million tokens each row costs its tokens; --max-cost stops starting
    episodes once spent (exit 3, the rest listed), and a re-run with more budget completes the
    run with the same rows as a run without a budget."""
    prices = ["--price-in", "2", "--price-out", "8"]
    with ChatServer(policy="finality_gate") as server:
        assert arm(server, tmp_path / "free", *prices) == 0
        free = read_rows(tmp_path / "free" / "episodes.jsonl")
        assert all(r["cost_microusd"] == 2 * r["tokens_in"] + 8 * r["tokens_out"] > 0
                   for r in free)
        one = free[0]["cost_microusd"] / 1e6
        out = tmp_path / "budget"
        assert arm(server, out, *prices, "--max-cost", f"{3 * one:.6f}") == EXIT_INCOMPLETE
        assert "no new episode starts" in capsys.readouterr().err
        rows = read_rows(out / "episodes.jsonl")
        assert 3 <= len(rows) < len(free)
        assert sum(r["cost_microusd"] for r in rows) >= 3 * one * 1e6 * 0.5
        incomplete = json.loads((out / "incomplete.json").read_text())
        assert incomplete and "max-cost" in json.dumps(incomplete)
        assert arm(server, out, *prices, "--max-cost", "100") == 0
    rows = read_rows(out / "episodes.jsonl")
    key = lambda r: (r["task_id"], r["seed"])  # noqa: E731
    assert sorted(map(key, rows)) == sorted(map(key, free))
    assert {key(r): r["gap"] for r in rows} == {key(r): r["gap"] for r in free}
    report = (out / "report.md").read_text()
    total = sum(r["cost_microusd"] for r in rows) / 1e6
    assert f"cost ${total:.4f} in all" in report


def test_a_budget_needs_prices(tmp_path, capsys):
    with ChatServer(policy="finality_gate") as server:
        assert arm(server, tmp_path, "--max-cost", "1") == 2
        assert server.requests == 0
    assert "--max-cost needs" in capsys.readouterr().err
