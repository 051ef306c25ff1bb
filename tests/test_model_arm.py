"""The model arm through the whole stack: a real HTTP server on 127.0.0.1 speaks Chat
Completions, and behind it a scripted model plays a scripted policy through tool calls."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import brief_for, make_policy, run_episode
import openai

from agents.model import (ConfigurationError, Endpoint, ModelConfig, ModelPolicy, brief_message,
                          returned, system_prompt)
from finality_gym.tools import chat_tools
from eval.model_arm import Transcript, read_transcript
from eval import model_arm
from eval.__main__ import EXIT_INCOMPLETE, main
from eval.runfolder import read_rows
from finality_gym import PROBE_ARMS, load_corpus
from finality_gym.episode import EpisodeRecord

from chat_server import OVERFLOW_STYLES, WAIT_ONLY, ChatServer, Fault

ROOT = Path(__file__).resolve().parent.parent
RECORD_FIELDS = [*EpisodeRecord._fields, "label"]
# A generous timeout (a loaded CI machine must never time a request out where a test counts
# retries); the stall test sets its own.
FAST = dict(timeout_s=30.0, backoff_s=0.001, backoff_max_s=0.01)


def config(server, **kw) -> ModelConfig:
    return ModelConfig(model="scripted-model", base_url=server.base_url, api_key_env="TEST_KEY",
                       **{**FAST, **kw})


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv("TEST_KEY", "test-key")
    monkeypatch.setenv("FINALITY_NO_PROGRESS", "1")


def records(rows, policy=None):
    return {(r["task_id"], r["seed"]): {f: r[f] for f in RECORD_FIELDS}
            for r in rows if policy is None or r["policy"] == policy}


def run_arm(server, out, probe="full", seeds=1, concurrency=2, **kw):
    summary = model_arm.run(out, config(server, **kw), probe=probe, seeds=seeds,
                            concurrency=concurrency, workers=1, progress=False)
    return summary, read_rows(out / "episodes.jsonl")


@pytest.mark.parametrize("probe", PROBE_ARMS)
def test_the_scripted_model_reproduces_the_gate_exactly_in_every_probe_arm(tmp_path, probe):
    with ChatServer(policy="finality_gate") as server:
        summary, rows = run_arm(server, tmp_path, probe=probe)
    assert len(rows) == len(model_arm.stratified_subset("public")) == 48
    scripted = read_rows(tmp_path / "scripted" / "episodes.jsonl")
    assert records(rows) == records(scripted, "finality_gate")
    assert all(r["agent_status"] == "ok" and r["retries"] == 0 for r in rows)
    assert all(r["requests"] == r["calls_used"] for r in rows)  # one call per reply
    model = summary["policies"]["model:scripted-model"]
    assert model["vs_baseline"]["baseline"] == "finality_gate"
    assert model["vs_baseline"]["mean_gap_diff"] == 0
    assert summary["model_arm"]["model:scripted-model"]["probe_used"] == (
        summary["model_arm"]["finality_gate"]["probe_used"])
    assert (tmp_path / "model_arm.png").stat().st_size > 10_000
    assert "Model arm: scripted-model" in (tmp_path / "report.md").read_text()


def test_a_reading_policy_is_reproduced_too(tmp_path):
    with ChatServer(policy="sop") as server:
        _, rows = run_arm(server, tmp_path)
    assert records(rows) == records(read_rows(tmp_path / "scripted" / "episodes.jsonl"), "sop")


def test_transient_failures_are_retried_and_counted_and_change_no_record(tmp_path):
    injected = []

    def faults(n, body):
        fault = None
        if n % 5 == 1:
            fault = Fault("status", status=429, headers={"Retry-After": "0.01"})
        elif n % 7 == 3:
            fault = Fault("status", status=500)
        elif n % 11 == 5:
            fault = Fault("drop")
        elif n % 13 == 6:
            fault = Fault("garbage")
        elif n % 193 == 8:
            fault = Fault("stall", seconds=4.0)
        if fault is not None:
            injected.append(fault.kind)
        return fault

    with ChatServer(policy="finality_gate", faults=faults) as server:
        # the schedule faults at most 5 requests in a row: 6 attempts always suffice
        _, rows = run_arm(server, tmp_path, concurrency=1, max_retries=5, timeout_s=2.0)
    assert records(rows) == records(read_rows(tmp_path / "scripted" / "episodes.jsonl"),
                                    "finality_gate")
    assert set(injected) == {"status", "drop", "garbage", "stall"}
    assert not server.errors
    assert sum(r["retries"] for r in rows) == len(injected)  # request 0 (preflight) is clean


def test_retries_exhausted_no_row_non_zero_exit_and_a_rerun_pays_no_turn_twice(tmp_path):
    out = tmp_path / "run"
    argv = ["model", "--model", "scripted-model", "--api-key-env", "TEST_KEY", "--out", str(out),
            "--concurrency", "1", "--max-retries", "2", "--timeout", "30", "--workers", "1"]
    with ChatServer(policy="sop", faults=lambda n, body: Fault("status", status=503)
                    if 40 <= n < 43 else None) as server:
        assert main(argv + ["--base-url", server.base_url]) == EXIT_INCOMPLETE
        first_turns = server.turns
    rows = read_rows(out / "episodes.jsonl")
    failed = json.loads((out / "incomplete.json").read_text())["episodes"]
    assert len(failed) == 1 and "503" in failed[0]["error"]
    assert not (out / "summary.json").exists()
    assert (failed[0]["task_id"], failed[0]["seed"]) not in records(rows)
    recorded = sum(len(read_transcript(p)) for p in (out / "transcripts").glob("*.jsonl"))
    assert recorded == first_turns - 3  # every answered turn is on disk
    with ChatServer(policy="sop") as server:
        assert main(argv + ["--base-url", server.base_url]) == 0
        rerun_turns = server.turns
    rows = read_rows(out / "episodes.jsonl")
    assert len(rows) == 48 and not (out / "incomplete.json").exists()
    again = [r for r in rows if (r["task_id"], r["seed"]) == (failed[0]["task_id"], failed[0]["seed"])]
    assert again[0]["replayed"] > 0
    total = sum(len(read_transcript(p)) for p in (out / "transcripts").glob("*.jsonl"))
    assert rerun_turns == total - recorded  # zero requests for the turns already recorded
    assert records(rows) == records(read_rows(out / "scripted" / "episodes.jsonl"), "sop")


@pytest.mark.parametrize("key,model,needle", [("wrong", "scripted-model", "API key"),
                                               ("test-key", "no-such-model", "--model")])
def test_bad_key_and_unknown_model_stop_at_preflight(tmp_path, capsys, monkeypatch, key, model,
                                                      needle):
    monkeypatch.setenv("TEST_KEY", key)
    with ChatServer() as server:
        code = main(["model", "--model", model, "--base-url", server.base_url, "--api-key-env",
                     "TEST_KEY", "--out", str(tmp_path)])
        assert server.requests == 1 and server.turns == 0
    assert code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "episodes.jsonl").exists()
    assert not (tmp_path / "run.json").exists()  # fixing the flag and re-running just works


def test_a_missing_key_variable_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TEST_KEY")
    with ChatServer() as server:
        assert main(["model", "--model", "scripted-model", "--base-url", server.base_url,
                     "--api-key-env", "TEST_KEY", "--out", str(tmp_path)]) == 2
        assert server.requests == 0
    assert "TEST_KEY" in capsys.readouterr().err


MALFORMED = ("unknown_tool", "bad_json", "text_only", "wrong_args", "string_int", "float_int",
             "empty_args_for_wait", "empty_object_for_wait", "invalid_then_call")


@pytest.mark.parametrize("kind", MALFORMED + ("trailing_call",))
def test_malformed_replies_are_answered_and_change_nothing(tmp_path, kind):
    # every reply at an even turn misbehaves (a wait-only kind: every wait's first reply); the
    # model gets the error and then acts right
    misbehaved = {"turn": -2}

    def misbehave(turn, call):
        if kind in WAIT_ONLY:
            if call[0] != "wait" or turn == misbehaved["turn"] + 1:  # the retry goes through
                return None
            misbehaved["turn"] = turn
            return kind
        if kind == "trailing_call":
            return kind
        return kind if turn % 2 == 0 and turn < 8 else None

    task_seeds = [(t, 0) for t in model_arm.stratified_subset("public")[::6]]
    corpus = load_corpus("public")
    with ChatServer(policy="finality_gate", misbehave=misbehave) as server:
        for task_id, seed in task_seeds:
            task = corpus.task(task_id)
            # a wait-only kind misbehaves at every wait: more invalid turns than the default cap
            policy = ModelPolicy(config(server, max_invalid_turns=40))
            got = run_episode(policy, task, seed)
            want = run_episode(make_policy("finality_gate"), task, seed)
            assert got == want, (kind, task_id)
            stats = policy.stats()
            assert stats["agent_status"] == "ok"
            if kind == "trailing_call":
                assert stats["invalid_turns"] == 0
            else:
                assert stats["requests"] == want.calls_used + stats["invalid_turns"]
    assert server.turns > 0
    assert server.sent[kind] > 0  # the kind was sent, not skipped


def test_a_model_that_never_calls_a_tool_lapses_at_its_cap(tmp_path):
    task = load_corpus("public").tasks[0]
    with ChatServer(misbehave=lambda turn, call: "text_only") as server:
        policy = ModelPolicy(config(server, max_invalid_turns=3))
        record = run_episode(policy, task, 0)
    assert (record.disposition, record.lapsed, record.calls_used) == ("close", True, 0)
    assert policy.stats()["agent_status"] == "invalid_turn_cap"
    assert policy.stats()["requests"] == 3


def test_request_and_token_caps_lapse_the_case(tmp_path):
    task = load_corpus("public").tasks[0]
    with ChatServer(policy="do_nothing") as server:
        # do_nothing waits to the horizon in one call: cap requests below that
        policy = ModelPolicy(config(server, max_requests=1))
        # the scripted model's first call is a wait to the horizon: it lapses by the clock
        record = run_episode(policy, task, 0)
        assert record.lapsed and policy.stats()["agent_status"] == "ok"
    with ChatServer(policy="finality_gate") as server:
        policy = ModelPolicy(config(server, max_requests=2))
        record = run_episode(policy, load_corpus("public").task("pub-000b-pending_fail"), 0)
        assert record.lapsed and policy.stats()["agent_status"] == "request_cap"
        assert policy.stats()["requests"] == 2 and record.calls_used == 2
        policy = ModelPolicy(config(server, max_total_tokens=1))
        record = run_episode(policy, load_corpus("public").task("pub-000b-pending_fail"), 0)
        assert record.lapsed and policy.stats()["agent_status"] == "token_cap"
        assert policy.stats()["requests"] == 1


def test_one_worker_and_several_write_identical_files(tmp_path):
    with ChatServer(policy="sop") as server:
        run_arm(server, tmp_path / "one", concurrency=1)
        run_arm(server, tmp_path / "four", concurrency=4)
    for name in ("episodes.jsonl", "summary.json", "report.md"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "four" / name).read_bytes()


def test_a_resume_under_a_changed_prompt_is_refused(tmp_path, monkeypatch):
    with ChatServer(policy="finality_gate") as server:
        run_arm(server, tmp_path)
        changed = tmp_path / "prompt.md"
        changed.write_text(Path(model_arm.__file__).parent.parent.joinpath(
            "agents", "prompts", "system.md").read_text() + "\nBe careful.\n")
        monkeypatch.setattr("agents.model.PROMPT_FILE", changed)
        with pytest.raises(ValueError, match="model"):
            run_arm(server, tmp_path)


def test_twin_halves_are_told_the_same_until_t_det(tmp_path):
    corpus = load_corpus("public")
    pairs = [u for u in corpus.units if len(u) == 2][::5]
    with ChatServer(policy="sop") as server:
        for settle, fail in pairs:
            conversations = []
            for task in (settle, fail):
                path = tmp_path / f"{task.task_id}.jsonl"
                run_episode(ModelPolicy(config(server), transcript=Transcript(path)), task, 0)
                messages = [m for line in read_transcript(path) for m in line["new_messages"]]
                conversations.append(messages)
            t_det = settle.t_det
            before = []
            for message in conversations[0]:
                if message["role"] == "tool" and json.loads(message["content"]).get("t", 0) >= t_det:
                    break
                before.append(message)
            assert len(before) >= 3
            assert conversations[1][:len(before)] == before
            assert brief_for(settle, 0, "full") == brief_for(fail, 0, "full")


def test_a_killed_run_resumes_without_losing_or_duplicating(tmp_path):
    out = tmp_path / "run"
    with ChatServer(policy="sop", faults=lambda n, body: Fault("stall", seconds=0.02)
                    if n % 3 == 0 else None) as server:
        cmd = [sys.executable, "-m", "eval", "model", "--model", "scripted-model", "--base-url",
               server.base_url, "--api-key-env", "TEST_KEY", "--out", str(out), "--concurrency",
               "2", "--no-progress", "--workers", "1"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "TEST_KEY": "test-key"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        path = out / "episodes.jsonl"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not path.exists() or
                                               len(path.read_bytes().splitlines()) < 10):
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        written = len(read_rows(path))
        assert 10 <= written < 48
        assert subprocess.run(cmd, cwd=ROOT, env={**os.environ, "TEST_KEY": "test-key"},
                              capture_output=True).returncode == 0
    rows = read_rows(path)
    assert len(rows) == 48 == len({(r["task_id"], r["seed"]) for r in rows})
    with ChatServer(policy="sop") as server:
        run_arm(server, tmp_path / "clean", concurrency=1)
    clean = read_rows(tmp_path / "clean" / "episodes.jsonl")
    assert [records([r]) for r in rows] == [records([r]) for r in clean]


def test_no_server_stops_the_run_at_preflight_with_what_to_fix(tmp_path, capsys):
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = main(["model", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1",
                 "--out", str(tmp_path)])
    assert code == 2
    assert "is the server running" in capsys.readouterr().err
    assert not (tmp_path / "episodes.jsonl").exists()


def test_a_conversation_that_outgrows_the_context_lapses_its_case_and_the_run_goes_on(
        tmp_path, capsys):
    """Through the command line (OpenAI's form): the long cases lapse as `context_overflow`,
    the short ones are graded as usual, and the run ends complete (exit 0)."""
    with ChatServer(policy="finality_gate", context_tokens=760) as server:
        code = _arm(server, tmp_path, "--max-tokens", "64")
    assert code == 0, capsys.readouterr().err
    rows = read_rows(tmp_path / "episodes.jsonl")
    assert len(rows) == len(model_arm.stratified_subset("public"))
    assert {r["agent_status"] for r in rows} == {"ok", "context_overflow"}
    assert all(r["lapsed"] for r in rows if r["agent_status"] == "context_overflow")


@pytest.mark.parametrize("style", OVERFLOW_STYLES)
def test_every_servers_way_of_saying_the_context_overflowed_lapses_the_case(style):
    """OpenAI's, vLLM's, llama.cpp's, Anthropic's layer's, a 413: each lapses the long case
    and leaves the short one alone."""
    corpus = load_corpus("public")
    seen = set()
    with ChatServer(policy="finality_gate", context_tokens=760, overflow=style) as server:
        for task_id in model_arm.stratified_subset("public")[::2]:
            task = corpus.task(task_id)
            policy = ModelPolicy(config(server, max_tokens=64))
            record = run_episode(policy, task, 0)
            status = policy.stats()["agent_status"]
            seen.add(status)
            assert record.lapsed or status == "ok"
    assert seen == {"ok", "context_overflow"}, style


def test_a_context_too_small_for_the_preflight_is_a_configuration_error(tmp_path, capsys):
    with ChatServer(policy="finality_gate", context_tokens=100) as server:
        code = main(["model", "--model", "scripted-model", "--base-url", server.base_url,
                     "--api-key-env", "TEST_KEY", "--out", str(tmp_path)])
        assert code == 2 and server.turns == 0
    err = capsys.readouterr().err
    assert "maximum context length is 100 tokens" in err
    assert "does not fit the model's context" in err
    assert not (tmp_path / "episodes.jsonl").exists()


def _arm(server, out, *more) -> int:
    return main(["model", "--model", "scripted-model", "--base-url", server.base_url,
                 "--api-key-env", "TEST_KEY", "--out", str(out), *more])


def test_a_reasoning_model_is_graded_with_the_fields_it_takes_and_that_is_pinned(
        tmp_path, capsys):
    """It refuses max_tokens (naming max_completion_tokens) and a temperature but 1: the
    preflight learns both, every request carries what it took, run.json and the report say
    so, and its reasoning and cached tokens are counted."""
    with ChatServer(policy="finality_gate", reasoning=True) as server:
        assert _arm(server, tmp_path, "--param", 'reasoning_effort="low"') == 0
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
        assert _arm(server, tmp_path, "--param", 'reasoning_effort="low"') == 0
        assert server.requests == 0
        assert _arm(server, tmp_path, "--param", 'reasoning_effort="high"') == 2
    assert "model" in capsys.readouterr().err
    assert requests > len(rows)


def test_no_param_keeps_a_field_out_of_every_request(tmp_path):
    with ChatServer(policy="finality_gate", reasoning=True) as server:
        assert _arm(server, tmp_path, "--no-param", "temperature", "--param",
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
        assert _arm(server, tmp_path, *args) == 2
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
        assert _arm(server, tmp_path / "free", *prices) == 0
        free = read_rows(tmp_path / "free" / "episodes.jsonl")
        assert all(r["cost_microusd"] == 2 * r["tokens_in"] + 8 * r["tokens_out"] > 0
                   for r in free)
        one = free[0]["cost_microusd"] / 1e6
        out = tmp_path / "budget"
        assert _arm(server, out, *prices, "--max-cost", f"{3 * one:.6f}") == EXIT_INCOMPLETE
        assert "no new episode starts" in capsys.readouterr().err
        rows = read_rows(out / "episodes.jsonl")
        assert 3 <= len(rows) < len(free)
        assert sum(r["cost_microusd"] for r in rows) >= 3 * one * 1e6 * 0.5
        incomplete = json.loads((out / "incomplete.json").read_text())
        assert incomplete and "max-cost" in json.dumps(incomplete)
        assert _arm(server, out, *prices, "--max-cost", "100") == 0
    rows = read_rows(out / "episodes.jsonl")
    key = lambda r: (r["task_id"], r["seed"])  # noqa: E731
    assert sorted(map(key, rows)) == sorted(map(key, free))
    assert {key(r): r["gap"] for r in rows} == {key(r): r["gap"] for r in free}
    report = (out / "report.md").read_text()
    total = sum(r["cost_microusd"] for r in rows) / 1e6
    assert f"cost ${total:.4f} in all" in report


def test_a_budget_needs_prices(tmp_path, capsys):
    with ChatServer(policy="finality_gate") as server:
        assert _arm(server, tmp_path, "--max-cost", "1") == 2
        assert server.requests == 0
    assert "--max-cost needs" in capsys.readouterr().err
