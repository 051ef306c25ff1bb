"""The red team's hostile replies through the whole model arm (`python -m eval model` against a
real HTTP server on 127.0.0.1): negative token counts cannot defeat a cap, 200,000-deep
arguments are the model's invalid call, a null message is the endpoint's infrastructure error,
an unreadable preflight stops the run; and a recorded turn, or `Endpoint.complete` alone, is
checked the same way."""

from __future__ import annotations

import json
import random

import pytest

import eval.models.arm as model_arm
from agents import run_episode
from agents.model import PREFLIGHT, Endpoint, InfrastructureError, ModelPolicy
from eval.__main__ import EXIT_INCOMPLETE
from eval.grading.runfolder import read_rows
from eval.models.arm import Transcript, read_transcript
from finality_gym import load_corpus

from tests.model.chat_server import ChatServer
from tests.model.hostile_replies import DEEP, RECORD, TASK, deep, first_turn
from tests.model.model_client import arm, config, key  # noqa: F401  (key: the autouse fixture)


def _arm(server, out, *more) -> int:
    """The command line, one episode at a time, with a 30 s deadline and two retries."""
    return arm(server, out, "--concurrency", "1", "--workers", "1", "--timeout", "30",
               "--max-retries", "2", *more)


def every_turn(edit):
    """A `rewrite` hook: `edit` answers every request but the preflight."""
    return lambda n, body, reply: None if any(
        m.get("content") == PREFLIGHT for m in body.get("messages") or []) else edit(reply)


@pytest.mark.parametrize("caps", [["--max-total-tokens", "100"],
                                  ["--price-in", "2", "--price-out", "8", "--max-cost", "0.01"]],
                         ids=["max-total-tokens", "max-cost"])
def test_negative_usage_cannot_defeat_a_cap_it_is_an_infrastructure_error(tmp_path, capsys,
                                                                          caps):
    """The red team: every reply reports -100,000 prompt tokens; before, all 48 episodes ran
    under a 100-token cap and the summary reported a negative cost. Now the first episode's
    first turn is unreadable: retried, then no row, no new episode, exit 3; the same command
    against an honest server completes the run."""
    negative = lambda reply: {**reply, "usage": {**reply["usage"],  # noqa: E731
                                                 "prompt_tokens": -100_000}}
    with ChatServer(policy="finality_gate", rewrite=every_turn(negative)) as server:
        assert _arm(server, tmp_path, *caps) == EXIT_INCOMPLETE
        assert server.turns == 3  # the first turn's three attempts; nothing after them
    said = " ".join(capsys.readouterr().err.split())
    assert "usage.prompt_tokens is -100000" in said, said
    rows = read_rows(tmp_path / "episodes.jsonl") if (tmp_path / "episodes.jsonl").exists() else []
    assert rows == [] and not (tmp_path / "summary.json").exists()
    failed = json.loads((tmp_path / "incomplete.json").read_text())["episodes"]
    assert len(failed) == 1 and "usage.prompt_tokens is -100000" in failed[0]["error"]
    with ChatServer(policy="finality_gate") as server:
        code = _arm(server, tmp_path, *caps)
    rows = read_rows(tmp_path / "episodes.jsonl")
    if caps[0] == "--max-total-tokens":
        assert code == 0 and len(rows) == 48
        assert all(r["agent_status"] == "token_cap" and r["requests"] == 1 for r in rows)
    else:  # one episode's tokens cost more than a cent: the budget stops the run, honestly
        assert code == EXIT_INCOMPLETE and rows
        assert all(r["cost_microusd"] > 0 for r in rows)


def test_200k_deep_arguments_are_an_invalid_call_and_the_run_goes_on(tmp_path):
    """The red team: 200,000-deep JSON arguments crashed the run with a RecursionError. Now
    they are the model's invalid call: two episodes get one invalid turn each, every episode
    is graded, each as the gate plays it."""
    hostile = []

    def rewrite(n, body, reply):  # the first turns of the first two episodes (one request each)
        if not first_turn(body) or len(hostile) == 2:
            return None
        hostile.append(n)
        reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] = deep(DEEP)
        return reply

    with ChatServer(policy="finality_gate", rewrite=rewrite) as server:
        assert _arm(server, tmp_path) == 0
        assert not server.errors
    rows = read_rows(tmp_path / "episodes.jsonl")
    assert len(rows) == len(model_arm.stratified_subset("public")) == 48
    assert sorted(r["invalid_turns"] for r in rows) == [0] * 46 + [1, 1]
    scripted = {(r["task_id"], r["seed"]): r
                for r in read_rows(tmp_path / "scripted" / "episodes.jsonl")
                if r["policy"] == "finality_gate"}
    for row in rows:
        want = scripted[(row["task_id"], row["seed"])]
        assert {f: row[f] for f in RECORD} == {f: want[f] for f in RECORD}
    assert (tmp_path / "summary.json").exists()


def test_a_null_message_is_an_infrastructure_error_after_the_retries(tmp_path, capsys):
    """The red team: `"message": null` crashed the run with an AttributeError. Now it is
    unreadable: three attempts, then the episode's infrastructure error (exit 3, listed in
    incomplete.json), and a re-run completes it."""
    def null_message(n, body, reply):  # every attempt of the first episode's first turn
        if first_turn(body) and server.turns <= 3:
            reply["choices"][0]["message"] = None
            return reply
        return None

    with ChatServer(policy="finality_gate", rewrite=null_message) as server:
        assert _arm(server, tmp_path) == EXIT_INCOMPLETE
        assert server.turns == 3 and not server.errors
    said = " ".join(capsys.readouterr().err.split())
    assert "3 attempts failed; last: unreadable body (choices[0].message is null" in said, said
    failed = json.loads((tmp_path / "incomplete.json").read_text())["episodes"]
    assert len(failed) == 1 and "choices[0].message is null" in failed[0]["error"]
    with ChatServer(policy="finality_gate") as server:
        assert _arm(server, tmp_path) == 0
    assert len(read_rows(tmp_path / "episodes.jsonl")) == 48


def test_an_unreadable_preflight_stops_the_run_saying_so(tmp_path, capsys):
    with ChatServer(policy="finality_gate",
                    rewrite=lambda n, body, reply: {**reply, "choices": []}) as server:
        assert _arm(server, tmp_path) == 2
        assert server.turns == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "choices is an empty array" in said and "not Chat Completions replies" in said, said


def test_a_recorded_turn_is_checked_again_when_it_is_replayed(tmp_path):
    """A transcript written before these checks (a negative count in it) is not believed on
    replay: the episode's infrastructure error says to move the file away."""
    path = tmp_path / "t.jsonl"
    task = load_corpus("public").task(TASK)
    with ChatServer(policy="finality_gate") as server:
        run_episode(ModelPolicy(config(server), transcript=Transcript(path)), task, 0)
        lines = read_transcript(path)
        lines[0]["response"]["usage"]["prompt_tokens"] = -5
        lines[0]["usage"]["prompt_tokens"] = -5
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        policy = ModelPolicy(config(server), transcript=Transcript(path))
        with pytest.raises(InfrastructureError, match="move the transcript away"):
            run_episode(policy, task, 0)


def test_the_endpoint_itself_refuses_an_unreadable_body_and_keeps_a_readable_one():
    """`Endpoint.complete` alone, as the preflight and every turn use it."""
    request = {"model": "scripted-model", "messages": [{"role": "user", "content": PREFLIGHT}]}
    with ChatServer(rewrite=lambda n, body, reply: None if n % 2 else {
            **reply, "usage": {"prompt_tokens": True}}) as server:
        endpoint = Endpoint(config(server, max_retries=1))
        body, _, attempts, errors = endpoint.complete(request, random.Random(0))
    assert attempts == 2 and "usage.prompt_tokens is true" in errors[0], errors
    assert body["choices"][0]["message"]["content"] == "ready"
