"""A model endpoint can neither hang nor flood a run: real HTTP servers on 127.0.0.1
(`tests/model/chat_server.py`'s trickle and flood faults) against the real client, through the
command line in a process of its own (so that a hang is a failed test, not a stuck suite, and
its peak memory is its own)."""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.model import (DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_MAX_TRANSCRIPT_BYTES, PREFLIGHT,
                          Endpoint, InfrastructureError, ModelConfig)
from eval.__main__ import EXIT_INCOMPLETE, main
from eval.models.arm import read_transcript
from eval.grading.runfolder import read_rows

from tests.model.chat_server import ChatServer, Fault
from tests.model.model_client import key  # noqa: F401  (the autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
MB = 1 << 20
# The child runs the command and says how it went on its last line: its exit code, how long
# the command took and its peak resident memory (KiB on Linux).
CHILD = """
import json, resource, sys, time
from eval.__main__ import main
started = time.monotonic()
code = main(sys.argv[1:])
print("RESULT " + json.dumps({"code": code, "seconds": time.monotonic() - started,
      "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}), flush=True)
"""


def command(server, out: Path, *more: str, limit: float) -> dict:
    """`python -m eval model` against `server` in a child process, killed past `limit` s."""
    argv = ["model", "--model", "scripted-model", "--base-url", server.base_url,
            "--api-key-env", "TEST_KEY", "--out", str(out), "--concurrency", "1",
            "--workers", "1", "--no-progress", *more]
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=ROOT, text=True,
                              capture_output=True, timeout=limit,
                              env={**os.environ, "TEST_KEY": "test-key"})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not end within {limit} s (killed)")
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    return {**json.loads(lines[-1][len("RESULT "):]), "stderr": done.stderr,
            "wall": time.monotonic() - started}


def from_request(first: int, fault: Fault):
    """A faults hook: every chat request from the `first`-th on gets `fault`."""
    return lambda n, body: fault if n >= first else None


def files_over(out: Path, size: int) -> list[str]:
    return [f"{p} ({p.stat().st_size} bytes)" for p in out.rglob("*")
            if p.is_file() and p.stat().st_size > size]


# ----------------------------------------------------------------- the deadline
@pytest.mark.parametrize("kind,first,timeout,code", [
    ("trickle", 2, 2, EXIT_INCOMPLETE),  # mid-run: the episode's infrastructure error
    ("trickle", 0, 1, 2),                # at the preflight: the run does not start
    ("trickle_head", 0, 1, 2),           # the status line and headers themselves trickle
], ids=["trickle-mid-run", "trickle-preflight", "trickle-headers-preflight"])
def test_a_trickling_endpoint_ends_the_run_at_its_deadline(tmp_path, kind, first, timeout, code):
    """Headers, then a byte every half second for ten minutes: no read ever times out, so only
    a deadline on the whole attempt ends it. Two attempts (--max-retries 1) of `timeout`
    seconds each, a backoff under a second: the command ends within seconds, saying why."""
    fault = Fault(kind, seconds=0.5, size=1200)
    with ChatServer(policy="finality_gate", faults=from_request(first, fault)) as server:
        result = command(server, tmp_path, "--timeout", str(timeout), "--max-retries", "1",
                         limit=60)
    assert result["code"] == code, result["stderr"][-2000:]
    assert 2 * timeout <= result["seconds"] < 2 * timeout + 20, result
    said = " ".join(result["stderr"].split())
    assert f"within the --timeout deadline of {timeout:g} s" in said, said
    rows = tmp_path / "episodes.jsonl"
    assert not rows.exists() or not read_rows(rows)  # nothing scored
    if code == EXIT_INCOMPLETE:
        failed = json.loads((tmp_path / "incomplete.json").read_text())["episodes"]
        assert len(failed) == 1 and "--timeout deadline" in failed[0]["error"]
        assert not (tmp_path / "summary.json").exists()
    else:
        assert "does not answer" in said and not (tmp_path / "run.json").exists()


# ----------------------------------------------------------------- the response cap
def test_a_flooding_endpoint_is_cut_at_the_response_cap(tmp_path):
    """A 300 MB answer (a valid body: the right tool call, 300 MB of content) to a turn and to
    its retry: each read stops at the cap, the episode gets no row, and the grader stays small
    and writes no large file."""
    fault = Fault("flood", status=200, size=300 * MB)
    with ChatServer(policy="finality_gate",
                    faults=lambda n, body: fault if n in (2, 3) else None) as server:
        result = command(server, tmp_path, "--timeout", "60", "--max-retries", "1", limit=90)
    assert result["code"] == EXIT_INCOMPLETE, result["stderr"][-2000:]
    said = " ".join(result["stderr"].split())
    assert f"--max-response-bytes cap of {DEFAULT_MAX_RESPONSE_BYTES:,} bytes" in said, said
    failed = json.loads((tmp_path / "incomplete.json").read_text())["episodes"]
    assert len(failed) == 1 and "--max-response-bytes" in failed[0]["error"]
    assert result["maxrss_kib"] < 1.5 * 1024 * 1024, result  # under 1.5 GiB resident
    assert not files_over(tmp_path, 100 * MB)
    assert result["seconds"] < 30, result


@pytest.mark.parametrize("status,headers", [(503, {}), (200, {"Content-Encoding": "gzip"})],
                         ids=["error-body", "gzip-bomb"])
def test_a_flooded_error_body_or_a_compressed_body_is_cut_too(status, headers):
    """The client reads an error's body itself, and would inflate a compressed one: neither
    passes the cap (a compressed body is refused: its size on the wire says nothing)."""
    fault = Fault("flood", status=status, size=300 * MB, headers=headers)
    request = {"model": "scripted-model", "messages": [{"role": "user", "content": PREFLIGHT}]}
    with ChatServer(faults=lambda n, body: fault) as server:
        endpoint = Endpoint(ModelConfig(model="scripted-model", base_url=server.base_url,
                                        api_key_env="TEST_KEY", timeout_s=30, max_retries=1,
                                        backoff_s=0.01, max_response_bytes=MB))
        started = time.monotonic()
        with pytest.raises(InfrastructureError) as caught:
            endpoint.complete(request, random.Random(0))
        assert time.monotonic() - started < 20
        assert server.requests == 2
    text = str(caught.value)
    assert ("--max-response-bytes cap of 1,048,576 bytes" if status == 503
            else "Content-Encoding gzip") in text, text


# ----------------------------------------------------------------- the transcript cap
def test_a_transcript_that_outgrows_its_cap_stops_its_episode_resumably(tmp_path, capsys):
    """An episode whose transcript would pass --max-transcript-bytes gets no row (an
    infrastructure error, retried first); no transcript passes the cap; the same command with
    a larger cap completes the run (the cap is not pinned)."""
    argv = ["model", "--model", "scripted-model", "--api-key-env", "TEST_KEY", "--out",
            str(tmp_path), "--concurrency", "1", "--workers", "1", "--max-retries", "1",
            "--timeout", "30"]
    cap = 12_000
    with ChatServer(policy="finality_gate") as server:
        code = main(argv + ["--base-url", server.base_url, "--max-transcript-bytes", str(cap)])
        assert code == EXIT_INCOMPLETE
        said = " ".join(capsys.readouterr().err.split())
        assert f"--max-transcript-bytes cap of {cap:,} bytes" in said, said
        transcripts = list((tmp_path / "transcripts").glob("*.jsonl"))
        assert transcripts and all(p.stat().st_size <= cap for p in transcripts)
        failed = json.loads((tmp_path / "incomplete.json").read_text())["episodes"]
        assert len(failed) == 1
        assert main(argv + ["--base-url", server.base_url]) == 0
    rows = read_rows(tmp_path / "episodes.jsonl")
    assert len(rows) == 48 and not (tmp_path / "incomplete.json").exists()
    assert all(read_transcript(p) for p in (tmp_path / "transcripts").glob("*.jsonl"))


def test_the_caps_are_options_with_their_defaults_shown(capsys):
    with pytest.raises(SystemExit):
        main(["model", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--max-response-bytes N" in text and f"default {DEFAULT_MAX_RESPONSE_BYTES}" in text
    assert "--max-transcript-bytes N" in text and f"default {DEFAULT_MAX_TRANSCRIPT_BYTES}" in text
    assert "a deadline for each request attempt as a whole" in text  # not for each read
