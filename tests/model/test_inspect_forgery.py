"""`python -m eval import-inspect` against forged logs: a genuine inspect log of
`eval/inspect_task.py` (the scripted chat server through inspect's own `openai-api` provider,
offline), edited with inspect's own `read_eval_log` / `write_eval_log` the way a red team did,
is refused with one line naming what is wrong and writes nothing; the genuine logs import with
the rows they hold (cases that end by a disposition, at a token cap, and at a context overflow),
marked self-reported, and an `--epochs 2` log imports both epochs as seeds."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from agents import make_policy
import eval.models.import_inspect as import_inspect
from eval.models.import_checks import same
from eval import __main__ as eval_main
from eval.grading.grader import RunConfig, grade_row
from eval.grading.runfolder import read_rows
from finality_gym import load_corpus
from finality_gym.episode import EpisodeRecord

from tests.model.chat_server import ChatServer, misbehave_schedule

inspect_ai = pytest.importorskip("inspect_ai", reason="the 'inspect' extra is not installed")
from inspect_ai import eval as inspect_eval  # noqa: E402
from inspect_ai.log import read_eval_log, write_eval_log  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CASES = 6  # the first six of the model arm's 48 cases: three pending twin pairs
ORACLE = "finality_oracle"
# A reminder and an invalid call in every conversation, as in tests/model/test_inspect.py.
MISBEHAVE = {1: "text_only", 3: "unknown_tool"}
TOKEN_CAP = 60_000  # the genuine log's max_total_tokens: some of its cases lapse at the cap
CONTEXT = 1_600     # the overflow log's server context (tokens): every case lapses at it


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """Three genuine logs, each made once: one epoch of the first CASES cases (some lapse at a
    token cap), two epochs of the first two, and one epoch of the first two on a server whose
    context they outgrow."""
    base = tmp_path_factory.mktemp("inspect_forgery")
    made = {}
    runs = (("genuine", None, CASES, 1, {"max_total_tokens": TOKEN_CAP}),
            ("epochs", None, 2, 2, {}), ("overflow", CONTEXT, 2, 1, {}))
    cwd = os.getcwd()
    os.chdir(ROOT)  # inspect resolves the task file relative to the working directory
    try:
        for name, context, limit, epochs, task_args in runs:
            with ChatServer(policy="react", misbehave=misbehave_schedule(MISBEHAVE),
                            context_tokens=context) as server:
                os.environ["LOCAL_BASE_URL"] = server.base_url
                os.environ["LOCAL_API_KEY"] = "test-key"
                result = inspect_eval("eval/inspect_task.py",
                                      model="openai-api/local/scripted-model",
                                      model_base_url=server.base_url,  # (as test_inspect.py)
                                      log_dir=str(base / name), log_format="json", limit=limit,
                                      epochs=epochs, task_args=task_args, display="none",
                                      max_connections=2, max_retries=2)
            assert result[0].status == "success", result[0].error
            made[name] = Path(result[0].location)
    finally:
        os.chdir(cwd)
    return made


def stored_rows(log) -> list[dict]:
    """The rows a log holds, in the grader's job order (task by task, seed by seed): what the
    import wrote before it checked anything but the records."""
    rows = [s.scores["engine_record"].metadata["row"] for s in log.samples]
    order = {t.task_id: i for i, t in enumerate(load_corpus("public").tasks)}
    return sorted(rows, key=lambda r: (order[r["task_id"]], r["seed"]))


def oracle_row(row: dict) -> dict:
    """The row as a forger writes it: the oracle's calls and record (and label) on the same
    case, the model's own requests, tokens and name kept."""
    rc = RunConfig((ORACLE,), seeds=(row["seed"],))
    oracle = grade_row(make_policy(ORACLE), ORACLE, load_corpus("public").task(row["task_id"]),
                       row["seed"], rc)
    return {**row, **{k: oracle[k] for k in (*EpisodeRecord._fields, "label", "calls")}}


_READ: dict = {}


def forge(log_path: Path, tmp_path: Path, edit, name: str = "forged.json") -> Path:
    """The log read, edited and written back by inspect's own functions (read once a module)."""
    if log_path not in _READ:
        _READ[log_path] = read_eval_log(str(log_path))
    log = _READ[log_path].model_copy(deep=True)
    edit(log)
    path = tmp_path / name
    write_eval_log(log, str(path))
    return path


def refused(path: Path, tmp_path: Path, match: str) -> str:
    out = tmp_path / "refused"
    with pytest.raises(ValueError, match=match) as caught:
        import_inspect.run(path, out, workers=1)
    assert not out.exists()
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


def set_row(sample, row: dict) -> None:
    score = sample.scores["engine_record"]
    score.metadata["row"] = row
    score.value = {"gap": row["gap"] / 100, "exact": float(row["gap"] == 0)}
    score.answer, score.explanation = row["disposition"], row["label"]


# -------------------------------------------------------------------------- the genuine log
def test_the_genuine_log_imports_its_own_rows_marked_self_reported(logs, tmp_path):
    log = read_eval_log(str(logs["genuine"]))
    summary = import_inspect.run(logs["genuine"], tmp_path / "out", workers=1)
    rows = read_rows(tmp_path / "out" / "episodes.jsonl")
    assert rows == stored_rows(log) and len(rows) == CASES
    assert {r["gap"] == 0 for r in rows} == {True, False}  # exact and inexact cases both
    # cases that ended by their disposition and cases the token cap ended (a lapse)
    assert {r["agent_status"] for r in rows} == {"ok", "token_cap"}
    pinned = json.loads((tmp_path / "out" / "run.json").read_text())
    assert pinned["self_reported"] is True
    assert pinned["inspect"]["log_sha256"] == hashlib.sha256(
        logs["genuine"].read_bytes()).hexdigest()
    assert pinned["inspect"]["task_args"] == log.eval.task_args
    assert pinned["inspect"]["task_version"] == 1 and pinned["inspect"]["limit"] == CASES
    assert pinned["inspect"]["model"] == "openai-api/local/scripted-model"
    assert summary["self_reported"] is True
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["self_reported"] is True
    report = (tmp_path / "out" / "report.md").read_text()
    assert "**Self-reported**" in report and pinned["inspect"]["log_sha256"] in report
    assert "the model was not re-run" in report and "log's own word" in report
    # the same log through inspect's own reader and writer, unedited, imports the same rows
    again = forge(logs["genuine"], tmp_path, lambda log: None, "rewritten.json")
    import_inspect.run(again, tmp_path / "again", workers=1)
    assert read_rows(tmp_path / "again" / "episodes.jsonl") == rows


def test_an_epochs_log_imports_every_epoch_as_a_seed(logs, tmp_path):
    log = read_eval_log(str(logs["epochs"]))
    assert sorted((s.id, s.epoch) for s in log.samples) == sorted(
        (s.id, e) for s in log.samples[:2] for e in (1, 2))
    import_inspect.run(logs["epochs"], tmp_path / "out", workers=1)
    rows = read_rows(tmp_path / "out" / "episodes.jsonl")
    assert len(rows) == 4 and rows == stored_rows(log)
    assert [(r["task_id"][:8], r["seed"]) for r in rows] == [
        ("pub-000a", 0), ("pub-000a", 1), ("pub-000b", 0), ("pub-000b", 1)]
    assert json.loads((tmp_path / "out" / "run.json").read_text())["seeds"] == [0, 1]
    # epoch 2 is another episode (seed 1), not the first one again
    assert rows[0]["calls"] != rows[1]["calls"] or rows[2]["calls"] != rows[3]["calls"]


def test_cases_a_context_overflow_ended_import_and_a_repeated_reply_only_from_version_0(
        logs, tmp_path):
    log = read_eval_log(str(logs["overflow"]))
    import_inspect.run(logs["overflow"], tmp_path / "out", workers=1)
    rows = read_rows(tmp_path / "out" / "episodes.jsonl")
    assert rows == stored_rows(log) and {r["agent_status"] for r in rows} == {
        "context_overflow"} and all(r["lapsed"] for r in rows)
    for sample in log.samples:  # each reply once, the last one's results sent (and refused)
        ids = [m.id for m in sample.messages if m.role == "assistant"]
        assert len(set(ids)) == len(ids) and sample.messages[-1].role == "tool"

    def repeat_last_reply(version):  # what version 0 of the task logged for such a case
        def edit(log):
            log.eval.task_version = version
            for sample in log.samples:
                replies = [m for m in sample.messages if m.role == "assistant"]
                sample.messages.append(replies[-1].model_copy(deep=True))
        return edit

    old = forge(logs["overflow"], tmp_path, repeat_last_reply(0), "version0.json")
    import_inspect.run(old, tmp_path / "old", workers=1)
    assert read_rows(tmp_path / "old" / "episodes.jsonl") == rows
    refused(forge(logs["overflow"], tmp_path, repeat_last_reply(1)), tmp_path,
            "conversation is not the one the task keeps")


# -------------------------------------------------------------------------- the forgeries
def test_the_oracles_calls_in_every_row_with_the_conversation_untouched_are_refused(
        logs, tmp_path):
    def edit(log):
        for sample in log.samples:
            set_row(sample, oracle_row(sample.scores["engine_record"].metadata["row"]))

    message = refused(forge(logs["genuine"], tmp_path, edit), tmp_path,
                      "calls are not the tool calls of its conversation")
    assert "(task pub-0" in message and "epoch 1" in message


def test_a_better_row_on_an_untouched_call_list_is_refused(logs, tmp_path):
    """The record alone edited (the calls left): the engine's replay says so."""
    def edit(log):
        sample = next(s for s in log.samples
                      if s.scores["engine_record"].metadata["row"]["gap"] > 0)
        row = sample.scores["engine_record"].metadata["row"]
        set_row(sample, {**row, "gap": 0, "label": "exact"})

    message = refused(forge(logs["genuine"], tmp_path, edit), tmp_path,
                      "does not replay to its record")
    assert "does not replay to its record" in message and "(task pub-" in message


def test_a_duplicate_sample_with_a_better_row_is_refused(logs, tmp_path):
    def duplicate(epoch):
        def edit(log):
            sample = next(s for s in log.samples
                          if s.scores["engine_record"].metadata["row"]["gap"] > 0)
            better = sample.model_copy(deep=True)
            better.epoch = epoch
            set_row(better, oracle_row(sample.scores["engine_record"].metadata["row"]))
            log.samples.append(better)  # last: the row a collapsing import keeps
        return edit

    message = refused(forge(logs["genuine"], tmp_path, duplicate(1)), tmp_path, "appears twice")
    assert "epoch 1" in message
    # as a second epoch the log never ran
    refused(forge(logs["genuine"], tmp_path, duplicate(2)), tmp_path,
            "is not one of the 6 samples")


def test_a_log_of_only_the_exact_samples_is_refused(logs, tmp_path):
    def exact_only(limit):
        def edit(log):
            log.samples = [s for s in log.samples
                           if s.scores["engine_record"].metadata["row"]["gap"] == 0]
            assert 0 < len(log.samples) < CASES
            log.eval.config.limit = limit(len(log.samples))
        return edit

    refused(forge(logs["genuine"], tmp_path, exact_only(lambda n: CASES)), tmp_path,
            r"holds \d of the 6 samples its task arguments .* declare \(the first 6 of its 48 "
            r"samples\); missing sample pub-")
    refused(forge(logs["genuine"], tmp_path, exact_only(lambda n: None)), tmp_path,
            r"holds \d of the 48 samples")
    refused(forge(logs["genuine"], tmp_path, exact_only(lambda n: n)), tmp_path,
            "is not one of the|missing sample")


def test_chosen_cases_are_refused(logs, tmp_path):
    def config(**fields):
        def edit(log):
            for key, value in fields.items():
                setattr(log.eval.config, key, value)
        return edit

    refused(forge(logs["genuine"], tmp_path, config(limit=None, sample_id=[
        s.id for s in read_eval_log(str(logs["genuine"])).samples])), tmp_path, "chosen samples")
    refused(forge(logs["genuine"], tmp_path, config(limit=(1, 7))), tmp_path,
            "not a count of first samples")
    assert "shuffled" in refused(forge(logs["genuine"], tmp_path, config(sample_shuffle=7)),
                                 tmp_path, "shuffled")


def test_an_epochs_log_collapsed_or_relabelled_is_refused(logs, tmp_path):
    def drop_epoch_2(log):  # one epoch of an --epochs 2 log
        log.samples = [s for s in log.samples if s.epoch == 1]

    refused(forge(logs["epochs"], tmp_path, drop_epoch_2), tmp_path,
            r"holds 2 of the 4 samples .* epochs \(2\) declare")

    def epoch_2_on_seed_0(log):  # as the task before version 1 played it
        sample = next(s for s in log.samples if s.epoch == 2)
        first = next(s for s in log.samples if s.epoch == 1 and s.id == sample.id)
        sample.messages = first.model_copy(deep=True).messages
        set_row(sample, first.scores["engine_record"].metadata["row"])

    message = refused(forge(logs["epochs"], tmp_path, epoch_2_on_seed_0), tmp_path,
                      "played seed 0, but the task plays seed 1")
    assert "played seed 0, but the task plays seed 1" in message


def test_the_logs_own_word_is_checked_where_it_can_be(logs, tmp_path):
    def row_edit(**fields):
        def edit(log):
            sample = log.samples[1]
            set_row(sample, {**sample.scores["engine_record"].metadata["row"], **fields})
        return edit

    refused(forge(logs["genuine"], tmp_path, row_edit(tokens_in=-5)), tmp_path,
            "tokens_in is -5, not a non-negative integer")
    refused(forge(logs["genuine"], tmp_path, row_edit(tokens_out="12")), tmp_path,
            "non-negative integer")
    refused(forge(logs["genuine"], tmp_path, row_edit(requests=3)), tmp_path,
            r"not what its conversation gives \(requests differ\)")
    refused(forge(logs["genuine"], tmp_path, row_edit(invalid_turns=0)), tmp_path,
            r"invalid_turns differ")
    refused(forge(logs["genuine"], tmp_path, row_edit(policy="model:gpt-9")), tmp_path,
            "rows of several models")

    def caps(log):  # a cap lower than the log's conversation needed
        log.eval.task_args = {**log.eval.task_args, "max_requests": 5}

    refused(forge(logs["genuine"], tmp_path, caps), tmp_path,
            "conversation is not the one the task keeps for its replies")

    def unknown_argument(log):
        log.eval.task_args = {**log.eval.task_args, "oracle": True}

    refused(forge(logs["genuine"], tmp_path, unknown_argument), tmp_path,
            "task arguments are not the task's")

    # what cannot be checked is recorded as logged: the model's name and the task version
    def names(log):
        log.eval.model, log.eval.task_version = "openai/gpt-9", 7

    path = forge(logs["genuine"], tmp_path, names)
    import_inspect.run(path, tmp_path / "named", workers=1)
    pinned = json.loads((tmp_path / "named" / "run.json").read_text())["inspect"]
    assert (pinned["model"], pinned["task_version"]) == ("openai/gpt-9", 7)
    assert read_rows(tmp_path / "named" / "episodes.jsonl") == stored_rows(
        read_eval_log(str(logs["genuine"])))


def test_the_rows_values_are_compared_as_json(logs, tmp_path):
    """`false` is not `0` and `120.0` is not `120` (Python's `==` says they are): such a row
    was sealed as logged, and the results folder's readers then failed on it."""
    def row_edit(**fields):
        def edit(log):
            sample = log.samples[1]
            row = sample.scores["engine_record"].metadata["row"]
            set_row(sample, {**row, **{k: f(row[k]) for k, f in fields.items()}})
        return edit

    edits = [({"seed": bool}, "played seed false, but the task plays seed 0"),
             ({"lapsed": int}, r"does not replay to its record \(lapsed differ\)"),
             ({"goods_left": int, "escalated": int},
              r"does not replay to its record \(escalated, goods_left differ\)"),
             ({"calls": lambda calls: [[float(c[0]), *c[1:]] for c in calls]},
              "calls are not the tool calls of its conversation")]
    for fields, match in edits:
        message = refused(forge(logs["genuine"], tmp_path, row_edit(**fields)), tmp_path, match)
        assert "sample" in message and not (tmp_path / "refused").exists(), fields
    assert not same(False, 0) and not same(120.0, 120)  # where Python's `==` says they are


def test_a_conversation_cut_short_and_relabelled_as_a_context_overflow_is_refused(
        logs, tmp_path):
    """A conversation cut after its first reply's tool results, read as a case its context
    overflow ended there, its row made again by the task's own replay (a lapse): refused, as
    the log's model answered longer requests (one model behind one endpoint has one window).
    The genuine overflow log imports (`test_cases_a_context_overflow_ended_import...`)."""
    from eval.models import inspect_task
    from inspect_ai.model import ModelUsage

    def cut_short(log):
        sample = log.samples[2]
        replies = [i for i, m in enumerate(sample.messages) if m.role == "assistant"]
        sample.messages = sample.messages[:replies[1]]
        row = sample.scores["engine_record"].metadata["row"]
        usage = ModelUsage(input_tokens=row["tokens_in"], output_tokens=row["tokens_out"],
                           total_tokens=row["tokens_in"] + row["tokens_out"],
                           reasoning_tokens=row["tokens_reasoning"],
                           input_tokens_cache_read=row["tokens_cached"])
        args = log.eval.task_args
        derived, _, _ = inspect_task.replay_conversation(
            sample.messages, row["policy"].removeprefix("model:"), "public", row["task_id"],
            row["seed"], row["probe"], {cap: args.get(cap, default) for cap, default in (
                ("max_requests", 80), ("max_invalid_turns", 8), ("max_total_tokens", None))},
            usage)
        assert derived["agent_status"] == "context_overflow" and derived["lapsed"]
        set_row(sample, json.loads(json.dumps(derived)))

    message = refused(forge(logs["genuine"], tmp_path, cut_short), tmp_path,
                      r"sample pub-.* \(task pub-.*, epoch 1\): it claims a context overflow on a "
                      r"request of [\d,]+ characters, shorter than one its run's endpoint answered")
    assert "larger context window" in message


def test_an_edited_conversation_is_refused(logs, tmp_path):
    def first_call(log):
        sample = log.samples[0]
        reply = next(m for m in sample.messages if m.role == "assistant" and m.tool_calls)
        return sample, reply

    def swap_a_call(log):  # the model's first call made another tool, its result left
        _, reply = first_call(log)
        reply.tool_calls[0].function = "read_erp"

    refused(forge(logs["genuine"], tmp_path, swap_a_call), tmp_path,
            r"conversation is not the one the task keeps for its replies \(message \d+")

    def edit_a_result(log):  # a tool result the engine never gave
        sample, _ = first_call(log)
        tool = next(m for m in sample.messages if m.role == "tool")
        tool.content = tool.content.replace('"t":120', '"t":121')

    refused(forge(logs["genuine"], tmp_path, edit_a_result), tmp_path,
            "conversation is not the one the task keeps")

    def cut_short(log):  # the last reply dropped: read as the context overflow it is not
        sample, _ = first_call(log)
        last = max(i for i, m in enumerate(sample.messages) if m.role == "assistant")
        sample.messages = sample.messages[:last]

    message = refused(forge(logs["genuine"], tmp_path, cut_short), tmp_path,
                      "calls are not the tool calls of its conversation")
    assert "calls are not the tool calls of its conversation" in message

    def extra_reply(log):  # a reply after the case ended
        sample, reply = first_call(log)
        sample.messages.append(reply.model_copy(deep=True))

    refused(forge(logs["genuine"], tmp_path, extra_reply), tmp_path,
            "conversation is not the one the task keeps")


def raw_row(sample, row) -> None:
    sample.scores["engine_record"].metadata["row"] = row


@pytest.mark.parametrize("edit", [
    lambda log: raw_row(log.samples[0], {"policy": "model:x"}),
    lambda log: raw_row(log.samples[0], ["not", "a", "row"]),
    lambda log: set_row(log.samples[0], {**log.samples[0].scores[
        "engine_record"].metadata["row"], "calls": "ship"}),
    lambda log: set_row(log.samples[0], {**log.samples[0].scores[
        "engine_record"].metadata["row"], "seed": "0"}),
    lambda log: setattr(log.samples[0], "metadata", {**log.samples[0].metadata,
                                                     "task_id": "pub-001-x"}),
    lambda log: setattr(log.samples[0], "scores", {}),
    lambda log: setattr(log.samples[0], "id", "pub-000a-pending_settle__seed9"),
    lambda log: setattr(log.eval, "task_args", {"seeds": "many"}),
    lambda log: setattr(log.eval, "task_args", {"split": "nowhere"}),
    lambda log: setattr(log.eval, "task", "other_task"),
    lambda log: setattr(log.samples[0].messages[2].tool_calls[0], "arguments", {"x": [1]}),
], ids=["row_of_nothing", "row_not_an_object", "calls_not_a_list", "seed_a_string",
        "metadata_of_another_task", "no_score", "another_sample", "seeds_not_a_count",
        "unknown_split", "another_task", "arguments_of_no_tool"])
def test_no_forgery_gives_a_traceback(logs, tmp_path, capsys, edit):
    path = forge(logs["genuine"], tmp_path, edit)
    out = tmp_path / "out"
    assert eval_main.main(["import-inspect", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()
