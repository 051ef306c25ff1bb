"""The verifiers environment's logic in the main venv (`eval/models/verifiers_cases.py`: opaque
case ids, options, the reward and the metrics) and `python -m eval import-verifiers`
(`eval/models/import_verifiers.py`) on runs written in vf-eval's shapes by `vf_traces.py` (the
shapes are checked against real vf-eval runs in `.venv-verifiers` by `test_verifiers_env.py`):
a genuine run imports as the arm's own rows, and an edited, forged or incomplete one is refused,
writing nothing."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import eval.models.arm as model_arm
import eval.models.import_verifiers as import_verifiers
from eval.grading.labels import LABELS, MONEY_LOSS, REVENUE_LOSS
from eval.grading.master_seed import keygen
from eval.grading.runfolder import json_lines, read_rows
from eval.models import verifiers_cases as vc
from finality_gym import load_corpus

from tests.model import vf_traces
from tests.model.chat_server import ChatServer, misbehave_schedule
from tests.model.model_client import config, key  # noqa: F401  (key: an autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
SEED_FILE = ROOT / "docs" / "leaderboard" / "docs_master_seed"  # published: a demonstration seed
OPTIONS = {"count": 6}  # the first six of the stratified subset's tasks, seed 0
MISBEHAVE = {1: "text_only", 3: "unknown_tool"}  # a reminder and an invalid call an episode


def test_case_ids_are_opaque_distinct_stable_and_keyed_by_the_split():
    public = vc.case_set(vc.Options())
    assert len(public.cases) == 48 and public.tasks == model_arm.stratified_subset("public")
    ids = [c.id for c in public.cases]
    assert len(set(ids)) == 48 and all(re.fullmatch(r"case-[0-9a-f]{20}", i) for i in ids)
    archetypes = {t.archetype for t in load_corpus("public").tasks}
    assert not any(name in i for i in ids for name in archetypes | set(public.tasks))
    assert ids == [c.id for c in vc.case_set(vc.Options()).cases]  # recomputed, the same
    two = vc.case_set(vc.Options(seeds=2))
    assert len({c.id for c in two.cases}) == 96 and [(c.task_id, c.seed) for c in two.cases][:2] \
        == [(two.cases[0].task_id, 0), (two.cases[0].task_id, 1)]  # a task's seeds together
    # the first message is the brief (no seed, no task id): twins get the same one
    system, brief = public.prompts(public.cases[0])
    assert public.cases[0].task_id not in brief + system and '"seed"' not in brief
    # keyed by the split's fingerprint, or the private split's master seed
    private = vc.case_set(vc.Options(split="private", master_seed_file=str(SEED_FILE)))
    seed = vc.read_master_seed(str(SEED_FILE))
    assert str(seed) not in repr(private) + json.dumps([c.__dict__ for c in private.cases])
    case = private.cases[0]
    assert case.id == vc.opaque_id(vc.id_key(private.corpus, seed), case.task_id, case.seed)
    assert case.id != vc.opaque_id(vc.id_key(private.corpus, None), case.task_id, case.seed)
    assert case.id != vc.opaque_id(vc.id_key(private.corpus, seed + 1), case.task_id, case.seed)
    regenerated = vc.case_set(vc.Options(split="regenerated", subset="all"))
    assert len(regenerated.cases) == len(load_corpus("regenerated").tasks)


def test_options_choose_archetypes_and_a_first_count_of_whole_tasks_and_are_checked():
    chosen = vc.case_set(vc.Options(subset="all", archetypes=("hard_decline",), seeds=3,
                                    count=5))
    corpus = chosen.corpus
    assert len(chosen.cases) == 15 and len(chosen.tasks) == 5
    assert {corpus.task(t).archetype for t in chosen.tasks} == {"hard_decline"}
    every = [t.task_id for t in corpus.tasks if t.archetype == "hard_decline"]
    assert chosen.tasks == tuple(every[:5])
    assert vc.Options.of({"archetypes": ["hard_decline"], "id": "x", "task": {}}).archetypes == (
        "hard_decline",)
    for bad in ({"split": "nope"}, {"split": "private"}, {"master_seed_file": str(SEED_FILE)},
                {"seeds": 0}, {"seeds": 101}, {"regime": "lenient"}, {"probe": "sometimes"},
                {"count": 0}, {"subset": "some"}, {"max_requests": 0}):
        with pytest.raises(ValueError):
            vc.case_set(vc.Options(**bad))
    with pytest.raises(ValueError, match="unknown"):
        vc.case_set(vc.Options(archetypes=("no_such",)))


def _order_tells(corpus, order: list[str]) -> dict:
    """What an order of tasks might tell: twin halves side by side, fates alternating,
    archetypes in blocks."""
    task = corpus.task
    twins: dict = {}
    for position, task_id in enumerate(order):
        if task(task_id).twin_id:
            twins.setdefault(task(task_id).twin_id, []).append(position)
    halves = [task(t).twin_half for t in order if task(t).twin_id]
    return {"adjacent_twins": sum(abs(a - b) == 1 for a, b in twins.values()),
            "pairs": len(twins), "alternating": all(a != b for a, b in zip(halves, halves[1:])),
            "same_archetype_neighbours": sum(task(a).archetype == task(b).archetype
                                             for a, b in zip(order, order[1:]))}


def test_the_tasksets_order_is_keyed_and_tells_no_archetype_twin_half_or_fate(tmp_path):
    """The corpus order of the stratified subset puts each pair's settle and fail halves side
    by side, alternating, and archetypes in blocks; the taskset's order (verifiers numbers its
    tasks: an HMAC of each task id under the ids' key) does not, on public and on a freshly
    keyed private split (a chance of about 1e-4 that a fresh key puts four of the six pairs side
    by side), and is the same for the same options, each task's seeds together, `count` the
    first tasks in corpus order."""
    keygen(tmp_path / "seed")
    fresh = {"split": "private", "master_seed_file": str(tmp_path / "seed")}
    docs = {"split": "private", "master_seed_file": str(SEED_FILE)}
    for options in ({}, fresh, docs):
        cases = vc.case_set(vc.Options(**options))
        in_corpus = _order_tells(cases.corpus, list(cases.tasks))
        assert in_corpus["adjacent_twins"] == in_corpus["pairs"] == 6
        assert in_corpus["alternating"] and in_corpus["same_archetype_neighbours"] >= 25
        order = [c.task_id for c in cases.cases]
        assert sorted(order) == sorted(cases.tasks) and order != list(cases.tasks)
        told = _order_tells(cases.corpus, order)
        assert told["adjacent_twins"] <= 3 and told["same_archetype_neighbours"] <= 15, told
        if options is not fresh:  # the fixed keys: no alternation of halves either
            assert not told["alternating"] and told["adjacent_twins"] <= 1, told
        vc.case_set.cache_clear()  # made again: the same order, the same with more seeds
        assert [c.id for c in vc.case_set(vc.Options(**options)).cases] == [
            c.id for c in cases.cases]
        two = vc.case_set(vc.Options(**options, seeds=2)).cases
        assert [c.task_id for c in two[::2]] == [c.task_id for c in two[1::2]] == order
        first = vc.case_set(vc.Options(**options, count=6))
        assert first.tasks == cases.tasks[:6]
        assert [c.task_id for c in first.cases] == [t for t in order if t in first.tasks]


def test_the_reward_falls_with_the_gap_and_exact_is_the_best():
    row = {"order_value": 2499, "label": "exact", "premature": False}
    rewards = [vc.reward({**row, "gap": gap}) for gap in (0, 1, 10, 100, 2499, 10_000, 10**7)]
    assert rewards[0] == 1.0 and rewards[4] == 0.5
    assert all(a > b > 0 for a, b in zip(rewards, rewards[1:]))
    assert vc.reward({**row, "gap": -500}) == 1.0  # beat_reference: no more than exact


@pytest.mark.parametrize("label", LABELS)
def test_the_metrics_of_a_row(label):
    row = {"order_value": 2000, "gap": 0 if label == "exact" else 250, "label": label,
           "premature": label == "shipped_unpaid"}
    assert vc.metrics(row) == {
        "exact": float(label == "exact"), "premature": float(label == "shipped_unpaid"),
        "gap_usd": 0.0 if label == "exact" else 2.5, "money_loss": float(label in MONEY_LOSS),
        "revenue_loss": float(label in REVENUE_LOSS)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run in vf-eval's shapes and the arm's own run of the same server on the same cases."""
    base = tmp_path_factory.mktemp("verifiers")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TEST_KEY", "test-key")
        with ChatServer(policy="react", misbehave=misbehave_schedule(MISBEHAVE)) as server:
            run = vf_traces.write_run(base / "run", server.base_url, OPTIONS)
            rc = vc.case_set(vc.Options.of(OPTIONS)).run_config("scripted-model")
            model_arm.grade_model(config(server), rc, base / "arm", concurrency=2,
                                  progress=False)
            assert not server.errors
    return base, run, read_rows(base / "arm" / "episodes.jsonl")


def test_a_run_imports_as_the_arms_own_rows(runs):
    base, run, arm = runs
    out = base / "imported"
    done = subprocess.run([sys.executable, "-m", "eval", "import-verifiers", str(run), "--out",
                           str(out), "--workers", "1"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = read_rows(out / "episodes.jsonl")
    assert imported == arm and len(arm) == 6
    assert all(r["invalid_turns"] == 2 for r in imported)  # the reminder and the invalid call
    pinned = json.loads((out / "run.json").read_text())
    assert pinned["self_reported"] is True and pinned["model"]["via"] == "verifiers"
    assert pinned["verifiers"]["log_sha256"] == hashlib.sha256(
        (run / "traces.jsonl").read_bytes()).hexdigest()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["self_reported"] is True and summary["model"]["sent"] == {
        "temperature": 0.0, "max_tokens": 1024}
    # the open regime is not pinned, as the arm pins it (a folder from before regimes resumes)
    assert "regime" not in pinned["model"] and "regime" not in summary["model"]
    assert "regime" not in json.loads((base / "arm" / "run.json").read_text())["model"]
    assert (out / "scripted" / "episodes.jsonl").is_file()
    report = (out / "report.md").read_text()
    assert "**Self-reported**: imported from a `verifiers` run" in report
    assert "inspect" not in report


@pytest.mark.parametrize("context", [1000, 3200])  # at the first request, and mid-case
def test_a_context_overflow_imports_as_the_arms_lapse(tmp_path, context):
    with ChatServer(policy="react", context_tokens=context) as server:
        run = vf_traces.write_run(tmp_path / "run", server.base_url, {"count": 3})
        cases = vc.case_set(vc.Options(count=3))
        arm = [vc.play(cases, case, "scripted-model", server.base_url, "test-key")
               for case in cases.cases]
    assert all(r["agent_status"] == "context_overflow" for r in arm)
    assert {r["requests"] > 0 for r in arm} == {context > 1000}
    assert _by_case(import_verifiers.rows_of(run)[0]) == _by_case(json.loads(json.dumps(arm)))


def _by_case(rows: list[dict]) -> dict:
    return {(r["task_id"], r["seed"]): r for r in rows}


def _edit_line(edit):
    def apply(lines, config):
        episode = json.loads(lines[1])
        edit(episode["traces"][0])
        lines[1] = json.dumps(episode)
    return apply


def _edit_episode(edit):
    def apply(lines, config):
        episode = json.loads(lines[1])
        edit(episode)
        lines[1] = json.dumps(episode)
    return apply


def _calls(edit):
    return _edit_line(lambda t: [edit(call) for call in t["calls"]])


def _first(trace, role):
    return next(n["message"] for n in trace["nodes"] if n["message"]["role"] == role)


def _config(edit):
    return lambda lines, config: edit(config)


def _set(path, value):
    def edit(config):
        holder = config
        for key in path[:-1]:
            holder = holder[key]
        holder[path[-1]] = value
    return _config(edit)


EDITS = {
    "a better gap": (_edit_line(lambda t: t["info"]["row"].update(
        gap=t["info"]["row"]["gap"] - 100)), "does not replay to its record"),
    "a malformed node": (_edit_line(lambda t: t["nodes"][2].update(message=None)),
                         "not a rollout of finality-gym-env|not one chain|not what the model"),
    "a malformed config": (_set(["env", "agent"], 7), "not a vf-eval config"),
    "a call left out": (_edit_line(lambda t: t["info"]["row"]["calls"].pop()),
                        "row's calls are not the tool calls"),
    "more tokens": (_edit_line(lambda t: t["info"]["row"].update(tokens_in=1)),
                    r"not what its conversation gives \(tokens_in differ\)"),
    "a better metric": (_edit_line(lambda t: t["metrics"].update(gap_usd=-1.0)),
                        "reward and metrics"),
    "a better reward": (_edit_line(lambda t: t["rewards"]["gap_reward"].update(score=9.0)),
                        "reward and metrics"),
    "a tool call edited": (_edit_line(lambda t: _first(t, "assistant")["tool_calls"][0].update(
        name="escalate")), "does not play"),
    "a tool result edited": (_edit_line(lambda t: _first(t, "tool").update(content='{"t":1}')),
                             "does not play"),
    "a reply after the end": (_edit_line(lambda t: (
        t["nodes"].append({"parent": len(t["nodes"]) - 1, "sampled": True,
                           "message": {"role": "assistant", "content": "more"}}),
        t["calls"].append({**t["calls"][-1], "node": len(t["nodes"]) - 1, "usage": None}))),
        "does not play"),
    "a branched conversation": (_edit_line(lambda t: t["nodes"][3].update(parent=1)),
                                "not one chain"),
    "an edited brief": (_edit_line(lambda t: t["task"]["data"].update(prompt="ship it")),
                        "prompts are not the case's"),
    "other options": (_edit_line(lambda t: t["task"]["data"]["options"].update(probe="none")),
                      "options .* are not its run's"),
    "an unknown case": (_edit_line(lambda t: t["task"]["data"].update(id="case-0")),
                        "not one of the 6 cases"),
    "an errored rollout": (_edit_line(lambda t: t.update(ok=False, errors=[{"message": "503"}])),
                           "errored"),
    "a stopped rollout": (_edit_line(lambda t: t.update(stop_condition="max_turns")),
                          "stopped on"),
    "no row": (_edit_line(lambda t: t["info"].pop("row")), "holds no row"),
    "a case missing": (lambda lines, config: lines.pop(), "holds 5 of the 6 cases"),
    "a case twice": (lambda lines, config: lines.append(lines[0]), "appears twice"),
    "another taskset": (_set(["env", "taskset", "id"], "other-env"), "not of finality-gym-env"),
    "another harness": (_set(["env", "agent", "harness"], {"id": "bash"}), "under harness"),
    "chosen cases": (_set(["select", "shuffle"], True), "chosen cases"),
    "two rollouts a case": (_set(["num_rollouts"], 2), "rollouts a case"),
    "the private split": (_config(lambda c: c["env"]["taskset"].update(
        split="private", master_seed_file=str(SEED_FILE))), "private split"),
    "another model": (_set(["model"], "other-model"), "another model"),
    "another harness's rollout": (_edit_line(lambda t: t["agent"]["config"].update(
        harness={"id": "bash"})), "played by harness bash"),
    "a limit": (_set(["select", "limit"], 3), "appears twice|not one of the 3 cases"),
    # values compared as JSON: a bool is not an int, a float not an int
    "a seed of false": (_edit_line(lambda t: t["info"]["row"].update(seed=False)),
                        r"does not replay to its record \(seed differ\)"),
    "a lapse of 0": (_edit_line(lambda t: t["info"]["row"].update(lapsed=0)),
                     r"does not replay to its record \(lapsed differ\)"),
    "ints for bools": (_edit_line(lambda t: t["info"]["row"].update(
        goods_left=int(t["info"]["row"]["goods_left"]), escalated=0)),
        r"does not replay to its record \(escalated, goods_left differ\)"),
    "float call times": (_edit_line(lambda t: t["info"]["row"].update(calls=[
        [float(c[0]), *c[1:]] for c in t["info"]["row"]["calls"]])),
        "row's calls are not the tool calls"),
    "an int metric": (_edit_line(lambda t: t["metrics"].update(exact=int(t["metrics"]["exact"]))),
                      "reward and metrics"),
    # every line of the run its config describes
    "another run's rollout": (_edit_episode(lambda e: e["run"].update(name="other-run")),
                              "a rollout of run other-run, not of its config's"),
    "another run id": (_edit_episode(lambda e: e["run"].update(id="disabled-other")),
                       "run id .* is not that of the run's other rollouts"),
    "another endpoint": (_edit_line(lambda t: t["agent"]["config"]["client"].update(
        base_url="http://127.0.0.1:1/v1")), "played against endpoint http://127.0.0.1:1/v1"),
    "another agent sampling": (_edit_line(lambda t: t["agent"]["config"]["sampling"].update(
        temperature=0.7)), "agent's sampling"),
    "a call of another model": (_calls(lambda c: c.update(model="gpt-9")), "asked for model"),
    "calls at another temperature": (_calls(lambda c: c["sampling"].update(temperature=1.3)),
                                     "call 0 was sampled with"),
    "calls with another field": (_calls(lambda c: c["sampling"].update(top_p=0.5)),
                                 "was sampled with"),
    "calls with a field left out": (_calls(lambda c: c["sampling"].pop("max_tokens")),
                                    "was sampled with"),
    "a config at another temperature": (_set(["sampling", "temperature"], 1.3),
                                        "agent's sampling"),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_an_edited_forged_or_incomplete_run_is_refused_and_nothing_is_written(runs, tmp_path,
                                                                              name):
    _, run, _ = runs
    edit, message = EDITS[name]
    lines = (run / "traces.jsonl").read_text().split("\n")[:-1]  # a reply may hold U+2028
    config = json.loads((run / import_verifiers.CONFIG).read_text())
    edit(lines, config)
    edited = tmp_path / "run"
    (edited / import_verifiers.CONFIG).parent.mkdir(parents=True)
    (edited / "traces.jsonl").write_text("".join(line + "\n" for line in lines))
    (edited / import_verifiers.CONFIG).write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message) as refused:
        import_verifiers.run(edited, tmp_path / "out", workers=1)
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_the_genuine_run_reads_back_in_the_graders_job_order(runs):
    _, run, arm = runs
    rows, info = import_verifiers.rows_of(run)
    assert rows == arm and [(r["task_id"], r["seed"]) for r in rows] == info["rc"].cases()


def _write(folder: Path, lines: list[str], config: dict) -> Path:
    (folder / import_verifiers.CONFIG).parent.mkdir(parents=True)
    (folder / "traces.jsonl").write_text("".join(line + "\n" for line in lines))
    (folder / import_verifiers.CONFIG).write_text(json.dumps(config))
    return folder


def _read(run: Path) -> tuple[list[str], dict]:
    return ((run / "traces.jsonl").read_text().split("\n")[:-1],
            json.loads((run / import_verifiers.CONFIG).read_text()))


def test_a_conversation_cut_short_and_relabelled_as_a_context_overflow_is_refused(runs, tmp_path):
    """The red team's `truncate_overflow`: a conversation cut after its first reply, its next
    request claimed to overflow the context, the row, reward and metrics made again by the
    project's own replay (a lapse, no loss); refused: the run's endpoint answered longer
    requests (one model behind one endpoint has one window). Genuine overflows import
    (`test_a_context_overflow_imports_as_the_arms_lapse`)."""
    _, run, _ = runs
    lines, config = _read(run)
    cases = vc.case_set(vc.Options.of(OPTIONS))
    episode = json.loads(lines[2])
    trace = episode["traces"][0]
    trace["nodes"] = trace["nodes"][:3]
    trace["calls"] = [trace["calls"][0], {**trace["calls"][0], "node": None, "usage": None,
                                          "error": {"type": "ProviderError"}}]
    case = cases.by_id()[trace["task"]["data"]["id"]]
    messages, turns, overflowed = import_verifiers.conversation(trace, cases.prompts(case))
    row, _ = vc.replay(cases, case, "scripted-model", messages, turns, overflowed)
    assert row["agent_status"] == "context_overflow" and row["lapsed"]
    trace["info"].update(row=row, label=row["label"])
    trace["rewards"] = {"gap_reward": {"score": vc.reward(row), "weight": 1.0}}
    trace["metrics"] = vc.metrics(row)
    lines[2] = json.dumps(episode)
    edited = _write(tmp_path / "run", lines, config)
    with pytest.raises(ValueError, match=r"traces.jsonl: line 3, case case-[0-9a-f]+ \(task "
                       r"pub-.*claims a context overflow on a request of [\d,]+ characters, "
                       r"shorter than one its run's endpoint answered") as refused:
        import_verifiers.run(edited, tmp_path / "out", workers=1)
    assert "\n" not in str(refused.value) and "larger context window" in str(refused.value)
    assert not (tmp_path / "out").exists()


def test_rollouts_of_two_runs_merged_are_refused(runs, tmp_path):
    """The red team's `merge_best`: each case's better rollout of two runs against two
    endpoints; refused as of another run, and, relabelled as this run's, as of another
    endpoint."""
    _, run, _ = runs
    with ChatServer(policy="finality_gate") as server:
        other = vf_traces.write_run(tmp_path / "other", server.base_url, OPTIONS)
    lines, config = _read(run)
    theirs = {json.loads(line)["traces"][0]["task"]["data"]["id"]: line
              for line in _read(other)[0]}

    def score(line):
        return json.loads(line)["traces"][0]["rewards"]["gap_reward"]["score"]

    ours = {json.loads(line)["traces"][0]["task"]["data"]["id"]: line for line in lines}
    merged = [max(line, theirs[i], key=score) for i, line in ours.items()]
    assert merged != lines and any(line in theirs.values() for line in merged)
    with pytest.raises(ValueError, match="rollouts of several runs are not imported"):
        import_verifiers.run(_write(tmp_path / "merged", merged, config), tmp_path / "out",
                             workers=1)
    label = json.loads(lines[0])["run"]
    relabelled = [json.dumps({**json.loads(line), "run": label}) for line in merged]
    with pytest.raises(ValueError, match="played against endpoint http://127.0.0.1:"):
        import_verifiers.run(_write(tmp_path / "relabelled", relabelled, config),
                             tmp_path / "out", workers=1)
    assert not (tmp_path / "out").exists()


def test_a_reply_holding_a_line_separator_imports(tmp_path):
    """vf-eval writes raw UTF-8: a reply's U+2028 (or U+2029, U+0085) is in the line as it is,
    and the run's lines are split on newlines alone."""
    def rewrite(n, body, reply):
        reply["choices"][0]["message"]["content"] = "ok\u2028done\u2029\x85"
        return reply

    with ChatServer(policy="finality_gate", rewrite=rewrite) as server:
        run = vf_traces.write_run(tmp_path / "run", server.base_url, {"count": 2})
    data = (run / "traces.jsonl").read_bytes()
    assert "\u2028".encode() in data and data.count(b"\n") == 2
    rows, _ = import_verifiers.rows_of(run)
    written = [json.loads(line)["traces"][0]["info"]["row"] for line in json_lines(data)]
    assert _by_case(rows) == _by_case(written) and len(rows) == 2
    assert json_lines(b'{"a": "x\xe2\x80\xa8y"}\r\n{"b": 1}\n{"c":') == [
        b'{"a": "x\xe2\x80\xa8y"}\r', b'{"b": 1}']  # a torn last line left out


def test_the_row_written_is_the_replays(runs, tmp_path):
    """A row the same JSON as the replay's, its keys in another order, imports as the replay
    made it."""
    _, run, arm = runs
    lines, config = _read(run)
    episode = json.loads(lines[0])
    row = episode["traces"][0]["info"]["row"]
    episode["traces"][0]["info"]["row"] = dict(reversed(row.items()))
    lines[0] = json.dumps(episode)
    rows, _ = import_verifiers.rows_of(_write(tmp_path / "run", lines, config))
    assert [list(r) for r in rows] == [list(r) for r in arm]
