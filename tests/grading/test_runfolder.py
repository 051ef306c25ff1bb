"""One module owns the run folder (`eval/grading/runfolder.py`), one parses policy specs
(`agents/spec.py`): readers change nothing, rows go in job order, a replaced model is graded as
what it now is, and every spec kind parses one way (the import graph: tests/test_layout.py)."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest

import finality_gym
from agents import PolicySpec, make_policy, split_specs
import eval.sweeps.aggregate as aggregate
from eval.grading.grader import RunConfig, grade, grade_in_process, without_calls
from eval.grading.runfolder import (OrderedAppender, keep_in_order, key, lock, read_rows, repair,
                                    seal)

ROOT = Path(__file__).resolve().parents[2]
TASKS = tuple(t.task_id for t in finality_gym.load_corpus("public").tasks[::40])
MODEL = ROOT / "models" / "ppo_full.zip"


def test_readers_never_change_a_torn_file_and_the_writer_repairs_it(tmp_path):
    config = RunConfig(("eager",), seeds=(0,), tasks=TASKS)
    rows = grade(config, tmp_path, progress=False)
    path = tmp_path / "episodes.jsonl"
    torn = path.read_bytes() + b'{"policy":"eag'
    path.write_bytes(torn)
    assert [without_calls(row) for row in read_rows(path)] == rows
    assert path.read_bytes() == torn  # the reader cut nothing off
    from eval.experiments.headline import recorded
    assert recorded(config, tmp_path, rows)[0] == rows  # the summary's reader neither: from
    assert recorded(config, tmp_path, [])[0] == rows  # the rows graded, or from the file
    assert path.read_bytes() == torn
    assert grade(config, tmp_path, progress=False) == rows  # the writer, under the lock, does
    assert path.read_bytes() == torn[:torn.rfind(b"\n") + 1]


def test_repair_cuts_only_a_torn_tail(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"a\nb\n")
    repair(path)
    assert path.read_bytes() == b"a\nb\n"
    path.write_bytes(b"a\nb")
    repair(path)
    assert path.read_bytes() == b"a\n"


def test_the_appender_writes_in_job_order_and_skips_failed_jobs(tmp_path):
    path = tmp_path / "out.jsonl"
    appender = OrderedAppender(path)
    assert appender.extend(2, ["c"]) == []
    assert appender.extend(1, [None]) == []
    assert path.read_text() == ""
    assert appender.extend(0, ["a"]) == ["a", "c"]
    assert appender.extend(3, ["d", "e"]) == ["d", "e"]
    appender.close()
    assert path.read_text() == "a\nc\nd\ne\n"


def test_keep_in_order_rewrites_only_a_file_out_of_job_order(tmp_path):
    rows = [{"policy": p, "task_id": t, "seed": 0, "gap": 0, "position": 0, "calls": [[120, p]]}
            for p, t in [("x", "other"), ("a", "t2"), ("a", "t1")]]
    path = tmp_path / "episodes.jsonl"
    path.write_text("".join(seal(r) + "\n" for r in rows))
    jobs = [("a", "t1", 0), ("a", "t2", 0)]
    keep_in_order(path, [key(r) for r in read_rows(path)], jobs)
    assert [(r["policy"], r["task_id"], r["calls"]) for r in read_rows(path)] == [
        ("x", "other", [[120, "x"]]), ("a", "t1", [[120, "a"]]), ("a", "t2", [[120, "a"]])]
    before = path.stat().st_mtime_ns
    keep_in_order(path, [key(r) for r in read_rows(path)], jobs)
    assert path.stat().st_mtime_ns == before


def test_a_sealed_line_is_json_dumps_of_the_row_and_its_check():
    """The line's format is fixed by every file already written: the encoders `seal` makes once
    give what `json.dumps` gives, unusual names and values included."""
    config = RunConfig(("eager", "finality_gate"), seeds=(0, 3), tasks=TASKS)
    rows = [{**row, "policy": name, "cost_usd": 0.1 + 0.2, "note": None}
            for spec, name in (("eager", "\u00e9ager \u2713"), ("finality_gate", 'gate "q"\\'))
            for row in grade_in_process(make_policy(spec), name, config)]
    for row in rows:
        canonical = json.dumps(row, sort_keys=True, separators=(",", ":"))
        check = hashlib.sha256(canonical.encode()).hexdigest()[:16]
        assert seal(row) == json.dumps({**row, "check": check}, separators=(",", ":"))
    assert "\\u00e9ager" in seal(rows[0])  # ASCII, as json.dumps writes it


def test_a_folder_graded_again_in_one_process_is_read_for_what_it_holds_now(tmp_path):
    """`grade` keeps the rows it last held for the next run of the same file (`eval all` grades
    the headline's folder three times): an edit of the same length made at once is still
    caught, and a caller's change to the rows it was given is not the next run's."""
    config = RunConfig(("eager",), seeds=(0,), tasks=TASKS)
    path = tmp_path / "episodes.jsonl"
    rows = grade(config, tmp_path, progress=False)
    rows[0]["gap"] = -1
    again = grade(config, tmp_path, progress=False)
    assert again == [without_calls(row) for row in read_rows(path)] and again[0]["gap"] != -1
    data = path.read_bytes()
    at = data.index(b'"gap":') + len(b'"gap":')
    digit = data[at:at + 1]
    path.write_bytes(data[:at] + (b"7" if digit == b"8" else b"8") + data[at + 1:])
    assert len(path.read_bytes()) == len(data)
    with pytest.raises(ValueError, match="episodes.jsonl:1 fails its checksum"):
        grade(config, tmp_path, progress=False)


def test_a_second_writer_is_refused_by_the_lock(tmp_path):
    with lock(tmp_path):
        with pytest.raises(ValueError, match="being written by another run"):
            grade(RunConfig(("eager",), seeds=(0,), tasks=TASKS), tmp_path, progress=False)


def _perturbed(source: Path, target: Path) -> None:
    from stable_baselines3 import PPO
    import torch
    model = PPO.load(source, device="cpu")
    with torch.no_grad():
        for parameter in model.policy.parameters():
            parameter.add_(0.5)
    model.save(target)


def test_a_model_file_replaced_in_one_process_is_graded_as_it_now_is(tmp_path):
    """The grader's policy cache is keyed by what the spec loads, not by the spec alone."""
    path = tmp_path / "model.zip"
    shutil.copy(MODEL, path)
    spec = f"ppo-greedy:{path}"
    config = RunConfig((spec,), seeds=(0,), tasks=TASKS)
    before = grade(config, tmp_path / "before", progress=False)
    _perturbed(MODEL, tmp_path / "other.zip")
    shutil.copy(tmp_path / "other.zip", path)
    after = grade(config, tmp_path / "after", progress=False)
    fresh = grade(RunConfig((f"ppo-greedy:{tmp_path / 'other.zip'}",), seeds=(0,), tasks=TASKS),
                  tmp_path / "fresh", progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "policy"} for r in rows]  # noqa
    assert strip(after) == strip(fresh)
    assert strip(after) != strip(before)  # the perturbation changed what the model does
    pinned = json.loads((tmp_path / "after" / "run.json").read_text())["inputs"][spec]
    assert pinned == hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("text,kind,target,arguments", [
    ("sop", "scripted", "sop", ""),
    ("sop:poll_interval=30,max_polls=6", "scripted", "sop", "poll_interval=30,max_polls=6"),
    ("plan:60,original,120,ship", "plan", "60,original,120,ship", ""),
    ("ppo:models/ppo_full.zip", "ppo", "models/ppo_full.zip", ""),
    ("ppo-greedy:m.zip", "ppo-greedy", "m.zip", ""),
    ("model:gpt-4o-mini", "model", "gpt-4o-mini", ""),
    ("model:qwen2.5:7b", "model", "qwen2.5:7b", ""),
    ("my_policy.py:Mine", "outside", "my_policy.py", "Mine"),
    ("pkg.policies:Mine", "outside", "pkg.policies", "Mine"),
    ("mymod:Mine", "outside", "mymod", "Mine"),
])
def test_every_spec_kind_parses_one_way_and_prints_back(text, kind, target, arguments):
    spec = PolicySpec.parse(text)
    assert (spec.kind, spec.target, spec.arguments) == (kind, target, arguments)
    assert str(spec) == text


@pytest.mark.parametrize("text,message", [
    ("psychic", "unknown policy 'psychic'"),
    ("ppo:", "ppo:... needs its argument"),
    ("model:gpt", "grade it with python -m eval model"),
    ("plan:60,ship", "bad plan"),
    ("react:x=1", "takes no knobs"),
])
def test_bad_specs_are_clear_errors(text, message):
    with pytest.raises(ValueError, match=message):
        make_policy(text)


def test_a_model_spec_is_not_an_outside_module():
    assert split_specs("model:gpt,sop") == ("model:gpt", "sop")
    assert PolicySpec.parse("model:gpt").source() is None


def test_the_aggregate_takes_a_greedy_learned_policy_too():
    assert aggregate.learned_spec(["sop", "ppo-greedy:m.zip", "finality_gate"]) == "ppo-greedy:m.zip"
    assert aggregate.learned_spec(["sop", "ppo:m.zip"]) == "ppo:m.zip"
    with pytest.raises(ValueError, match="expected one learned policy"):
        aggregate.learned_spec(["sop", "ppo:a.zip", "ppo-greedy:b.zip"])
