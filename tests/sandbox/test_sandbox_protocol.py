"""The host owns the protocol, and nothing of a case reaches the next: the red-team attacks of
`tests/sandbox/redteam/os_channel.py`, `os_metadata.py`, `os_daemon.py` and `os_overrun.py`,
through the command line, with the sandbox on (each finds nothing, or is refused with a message
naming the policy) and, where the attack is on the sandbox rather than on the protocol, off (each
works, so the test can fail). The harness (`attack`, `headline`, the sandbox's skip-or-fail) is
`tests/sandbox/sandbox_harness.py`.
"""

from __future__ import annotations

import json
import re
import secrets

import pytest

from tests.sandbox.sandbox_harness import (  # noqa: F401
    SANDBOX, TASKS, _one_matplotlib_cache, all_refund, attack, end_leftovers, grading, headline)


OURS = re.compile(r'File "[^"]*/(agents|eval|finality_gym)/')  # a traceback of the project's


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """`graded(sandbox)`: one run of the attacks that let a run go on (one worker: its cases
    would share what persists), graded when a test first asks for it."""
    runs = {}

    def get(sandbox: str):
        if sandbox not in runs:
            base = tmp_path_factory.mktemp(f"protocol-{sandbox}")
            (base / "scratch").mkdir()
            specs = {"channel": attack(base, "os_channel", "GraderChannel"),
                     "metadata": attack(base, "os_metadata", "Metadata",
                                        PLACE=str(base / "scratch")),
                     "relay": attack(base, "os_hook", "Relay")}
            runs[sandbox] = specs, headline(base, list(specs.values()), sandbox, workers=1)
        return runs[sandbox]
    return get


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_case_holds_the_graders_channel(graded, sandbox):
    """Sandbox or not: a case holds its own socket to the host, never the grader's pipe."""
    grading(sandbox)
    specs, run = graded(sandbox)
    assert run.code == 0, run
    assert run.dispositions(specs["channel"]) == {"refund": TASKS}, run


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_hook_in_the_fork_server_relays_one_case_to_the_next(graded, sandbox):
    """Code the import leaves in the fork server rewrites the case's filter and relays every
    case's brief and results to the next: the case's own network namespace, which the host
    checks from /proc, stops it sandboxed; unsandboxed it works."""
    grading(sandbox)
    specs, run = graded(sandbox)
    spec = specs["relay"]
    if sandbox == "on":
        all_refund(run, spec)
    else:
        assert run.code == 0, run
        assert run.dispositions(spec) == {"refund": 1, "ship": TASKS - 1}, run.dispositions(spec)


def _inodes(run, spec: str) -> list[int]:
    """The inode numbers os_metadata encoded in each case's first call (a wait)."""
    return [row["calls"][0][2] for row in run.rows() if row["policy"] == spec]


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_case_reads_the_metadata_an_earlier_case_left(graded, sandbox):
    """Times, modes and extended attributes of the writable places, and the inode number of a
    new file: each case gets new ones."""
    grading(sandbox)
    specs, run = graded(sandbox)
    spec = specs["metadata"]
    assert run.code == 0, run
    if sandbox == "on":
        assert run.dispositions(spec) == {"refund": TASKS}, run.dispositions(spec)
        assert len(set(_inodes(run, spec))) == 1, _inodes(run, spec)
    else:  # (a disk may give a deleted file's inode number to the next: not compared)
        assert run.dispositions(spec) == {"refund": 1, "ship": TASKS - 1}, run.dispositions(spec)


@pytest.mark.parametrize("mode", ["IMPORT", "AT_FORK"])
@pytest.mark.parametrize("sandbox", SANDBOX)
def test_no_process_started_by_the_import_outlives_a_case(tmp_path, sandbox, mode):
    """A server the import starts (at once, or when the first case is forked) and that counts
    the cases connecting to it: refused sandboxed, with the policy named and no traceback; one
    a hook starts once the import was checked is not even started (the host lets the fork
    server fork only the cases it asks for), so every case refunds."""
    grading(sandbox)
    pids = tmp_path / "daemon.pids"
    spec = attack(tmp_path, "os_daemon", "Daemon", TOKEN=secrets.token_hex(8), MODE=mode,
                  PIDS=str(pids), LIFE=30)
    try:
        run = headline(tmp_path, [spec], sandbox, workers=1)
    finally:
        leftovers = end_leftovers(pids, spec.rpartition(":")[0])
    if sandbox == "on" and mode == "AT_FORK":
        assert run.code == 0 and run.dispositions(spec) == {"refund": TASKS}, run
        assert not leftovers
    elif sandbox == "on":  # (the policy's own traceback, of its hook, is relayed: not ours)
        assert run.code == 2 and not OURS.search(run.stderr), run
        assert spec in run.stderr and "process" in run.stderr, run
        assert "could not be loaded" in run.stderr, run
        assert run.dispositions(spec).get("ship", 0) == 0, run.dispositions(spec)
        assert not leftovers
    else:  # every case after the server started reaches it (one or two start before)
        assert run.code == 0, run
        assert run.dispositions(spec)["ship"] >= TASKS - 2, run.dispositions(spec)


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_a_message_past_a_cases_turn_is_an_error_naming_the_task(tmp_path, sandbox):
    grading(sandbox)
    spec = attack(tmp_path, "os_overrun", "Overrun")
    run = headline(tmp_path, [spec], sandbox, workers=1)
    assert run.code == 2 and "Traceback" not in run.stderr, run
    # (every case is: its two extra lines arrive together; a lone line that arrived only after
    # the host killed the case would be neither caught nor read)
    assert re.search(rf"{re.escape(spec)}.* failed on task \S+ seed 0: .*(before its turn|"
                     r"after its last)", run.stderr), run


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_every_chunk_gets_a_fresh_fork_server(tmp_path, sandbox):
    """A count of cases kept by a hook in the fork server (os_count) restarts with every chunk
    of work, each played in an unrecorded order: it never tells which chunk, and so which jobs,
    a case plays. Two chunks of 6 jobs through one worker's cached policy."""
    grading(sandbox)
    import eval.grading.grader as grader
    from agents.sandbox.external import ExternalPolicy
    spec = attack(tmp_path, "os_count", "Count")
    tasks = tuple(task.task_id for task in grader.load_corpus("public").tasks[:12])
    config = grader.RunConfig((spec,), seeds=(0,), tasks=tasks, sandbox=sandbox == "on")
    inputs = {spec: grader.input_identity(spec)}
    counts = []
    try:
        for chunk in (tasks[:6], tasks[6:]):
            lines, _, error = grader._run_chunk(
                grader.Chunk.of(config, [(spec, t, 0) for t in chunk], inputs))
            assert error is None and len(lines) == len(chunk), error
            counts.append([json.loads(line)["calls"][0][2] for line in lines])
    finally:
        grader._close_external()
    assert min(counts[1]) <= 2, counts  # the second chunk counts from 1 again
    assert not any(isinstance(p, ExternalPolicy) for p in grader._POLICIES.values())


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_a_policys_standard_error_is_relayed_capped(tmp_path, sandbox):
    """4 MiB a case, 16 cases: at most 64 KiB a case, 1 MiB a process, reach the grader's."""
    grading(sandbox)
    spec = attack(tmp_path, "os_flood", "Stderr", MIB=4)
    run = headline(tmp_path, [spec], sandbox, workers=1)
    all_refund(run, spec)
    assert len(run.stderr) < (1 << 20) + 100_000, len(run.stderr)
    assert "standard error was cut" in run.stderr


@pytest.mark.parametrize("sandbox", SANDBOX)
def test_a_protocol_line_over_the_cap_is_an_error(tmp_path, sandbox):
    grading(sandbox)
    spec = attack(tmp_path, "os_flood", "LongLine", MIB=2)
    run = headline(tmp_path, [spec], sandbox, workers=1)
    assert run.code == 2 and not OURS.search(run.stderr), run
    assert re.search(rf"{re.escape(spec)}.* failed on task \S+ seed 0: .*over 1048576 bytes",
                     run.stderr), run
