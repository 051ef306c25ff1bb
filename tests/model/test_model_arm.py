"""The model arm through the whole stack: a real HTTP server on 127.0.0.1 speaks Chat
Completions, and behind it a scripted model plays a scripted policy through tool calls. An
endpoint's own terms (the fields it takes, what it wants back, what it costs) are
`test_model_endpoint_terms.py`'s."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import brief_for, make_policy, run_episode
from agents.model import PROMPT_FILE, ModelPolicy
from eval.models.arm import Transcript, read_transcript
import eval.models.arm as model_arm
from eval.__main__ import EXIT_INCOMPLETE, main
from eval.grading.runfolder import read_rows
from finality_gym import PROBE_ARMS, load_corpus
from finality_gym.episode import EpisodeRecord

from tests.model.chat_server import OVERFLOW_STYLES, WAIT_ONLY, ChatServer, Fault
from tests.model.model_client import arm, config, key  # noqa: F401  (key: the autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
RECORD_FIELDS = [*EpisodeRecord._fields, "label"]


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
        changed.write_text(PROMPT_FILE.read_text() + "\nBe careful.\n")
        monkeypatch.setattr("agents.model.prompt.PROMPT_FILE", changed)
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
        code = arm(server, tmp_path, "--max-tokens", "64")
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
