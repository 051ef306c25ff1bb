"""A model says what it was trained for, end to end: a tiny MaskablePPO trained by `python -m
train` on `FinalityNoProbe-v0` carries the env id, probe arm, observation layout and action
table in every archive it saves, `python -m train export` carries them into the ONNX graph, and
every command that grades it (`eval headline`, `eval show`, `eval submit`, `eval verify`) refuses
the full-probe arm naming both arms and grades it on its own; a model without metadata (the
shipped `models/ppo_full.zip`, a graph exported from it) is graded with one note."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from pathlib import Path

import onnx
import pytest
from sb3_contrib import MaskablePPO

from agents.learned import trained_for
from agents.learned.policy import load_sb3
from agents.learned.trained_for import (TrainedFor, action_names, observation_names,
                                        read_archive, read_onnx)
from eval.__main__ import main as eval_cli
from eval.board.bundle import BundleError, bundle_of, pack, read_bundle
from eval.grading.runfolder import read_rows
from finality_gym.corpus import new_master_seed
from train.__main__ import main as train_cli

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "models" / "ppo_full.zip"  # trained before models said what for
TASKS = "pub-000a-pending_settle,pub-000b-pending_fail,pub-115-stale_processor"
FAST = ["--seeds", "1", "--tasks", TASKS, "--workers", "1", "--no-progress"]
# the tests' budget for a training run (tests/training/test_train.py's), on the no-probe arm
TINY = ["--env", "FinalityNoProbe-v0", "--masked", "--timesteps", "1024", "--n-envs", "2",
        "--n-steps", "256", "--batch-size", "256", "--n-epochs", "2", "--eval-every", "512",
        "--validation-stride", "32", "--checkpoint-every", "512", "--final-seeds", "1"]
REFUSED = ("{spec} was trained on FinalityNoProbe-v0 (probe arm none); it is graded on probe "
           "arm {arm}: refused")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run folder of `python -m train ppo` (its final grading included) and its export."""
    base = tmp_path_factory.mktemp("arm")
    assert train_cli(["ppo", *TINY, "--out", str(base / "run")]) == 0
    assert train_cli(["export", str(base / "run"), "--onnx", str(base / "noprobe.onnx")]) == 0
    return base / "run", base / "noprobe.onnx"


@pytest.fixture(autouse=True)
def no_notes_yet(monkeypatch):
    """Each test starts as a fresh process does: no model noted yet."""
    monkeypatch.setattr(trained_for, "_NOTED", set())


def test_every_archive_of_the_run_says_what_it_was_trained_for(run):
    folder, _ = run
    archives = [folder / "best_model.zip", *sorted((folder / "checkpoints").glob("*.zip"))]
    assert len(archives) == 3  # the best, and the checkpoints at 512 and 1,024 steps
    for archive in archives:
        with zipfile.ZipFile(archive) as z:
            document = json.loads(z.read("finality.json"))
        assert document == {"format": "finality-trained-for/1", "env_id": "FinalityNoProbe-v0",
                            "probe": "none", "observation_fields": list(observation_names()),
                            "actions": list(action_names())}
        assert MaskablePPO.load(archive, device="cpu").num_timesteps > 0  # SB3's own loader
        assert load_sb3(archive, kind="ppo").name == f"ppo:{archive}"  # the data loader
    # the run's own final grading, on its arm, went through the same check
    assert json.loads((folder / "eval_public" / "summary.json").read_text())["probe"] == "none"


def test_export_carries_it_into_the_graph(run, tmp_path, capsys):
    folder, graph = run
    props = {p.key: p.value for p in onnx.load(str(graph)).metadata_props}
    assert props["finality_gym.env_id"] == "FinalityNoProbe-v0"
    assert props["finality_gym.probe"] == "none"
    assert json.loads(props["finality_gym.observation_fields"]) == list(observation_names())
    assert len(json.loads(props["finality_gym.actions"])) == 16
    assert props["finality_gym.algorithm"] == "MaskablePPO"  # beside what was there before
    assert read_onnx(graph) == TrainedFor.of_env("FinalityNoProbe-v0") == read_archive(
        folder / "best_model.zip")
    # a bare archive says it itself
    assert train_cli(["export", str(folder / "best_model.zip"), "--onnx",
                      str(tmp_path / "bare.onnx")]) == 0
    assert "trained on FinalityNoProbe-v0 (probe arm none)" in capsys.readouterr().out
    assert read_onnx(tmp_path / "bare.onnx") == read_onnx(graph)
    # a run folder's config.json names the env; the archive's own record must agree with it
    other = tmp_path / "other"
    other.mkdir()
    shutil.copy(folder / "best_model.zip", other / "best_model.zip")
    config = json.loads((folder / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "env": "Finality-v0"}))
    assert train_cli(["export", str(other), "--onnx", str(tmp_path / "x.onnx")]) == 2
    assert (f"{other / 'best_model.zip'} says it was trained on FinalityNoProbe-v0 (probe arm "
            f"none), its run's {other / 'config.json'} says Finality-v0 (probe arm full): they "
            "must agree") in capsys.readouterr().err
    assert not (tmp_path / "x.onnx").exists()
    # a run saved before archives said it: its config.json says it alone
    shutil.copy(SHIPPED, other / "best_model.zip")
    assert train_cli(["export", str(other), "--onnx", str(tmp_path / "x.onnx")]) == 0
    assert read_onnx(tmp_path / "x.onnx") == TrainedFor.of_env("Finality-v0")


def test_grading_it_on_another_arm_is_refused_naming_both(run, tmp_path, capsys):
    folder, graph = run
    for spec in (f"onnx:{graph}", f"ppo:{folder / 'best_model.zip'}"):
        out = tmp_path / "full"
        assert eval_cli(["headline", "--policies", spec, "--probe", "full", *FAST, "--out",
                         str(out)]) == 2
        assert capsys.readouterr().err == "error: " + REFUSED.format(spec=spec, arm="full") + "\n"
        assert not out.exists()
    png = tmp_path / "x.png"
    assert eval_cli(["show", "--policy", f"onnx-greedy:{graph}", "--task",
                     "pub-000b-pending_fail", "--probe", "delayed", "--out", str(png)]) == 2
    assert REFUSED.format(spec=f"onnx-greedy:{graph}", arm="delayed") in capsys.readouterr().err
    assert not png.exists()


def test_grading_it_on_its_own_arm_works(run, tmp_path, capsys):
    folder, graph = run
    specs = f"onnx:{graph},sb3:{folder / 'best_model.zip'}"
    assert eval_cli(["headline", "--policies", specs, "--probe", "none", *FAST, "--out",
                     str(tmp_path / "none")]) == 0
    assert "note:" not in capsys.readouterr().err
    rows = read_rows(tmp_path / "none" / "episodes.jsonl")
    assert len(rows) == 6 and {row["probe"] for row in rows} == {"none"}


def test_a_bundle_is_graded_on_the_arm_its_model_was_trained_for(run, tmp_path, capsys):
    """The model as `onnx:` and as `sb3:`, and two rules, submitted with `--probe none`, are
    verified on that arm and shown (headless chromium) in the `none` group with its gate and
    its best rule; the model submitted for the full arm is refused, its arm named."""
    from tests.site.test_view import Recorder, dom  # skips this test where chromium is missing
    folder, graph = run
    (tmp_path / "seed").write_text(f"{new_master_seed()}\n")
    specs = {"np": f"onnx:{graph}", "np-sb3": f"sb3:{folder / 'best_model.zip'}",
             "gate": "finality_gate", "sop": "sop"}
    for name, spec in list(specs.items())[:2]:
        full = tmp_path / f"{name}-full.finality"
        assert eval_cli(["submit", spec, "--name", name, "--out", str(full)]) == 2
        assert REFUSED.format(spec=spec, arm="full") in capsys.readouterr().err
        assert not full.exists()
    bundles = [str(tmp_path / f"{name}.finality") for name in specs]
    for (name, spec), bundle in zip(specs.items(), bundles):
        assert eval_cli(["submit", spec, "--name", name, "--probe", "none", "--out",
                         bundle]) == 0
        assert read_bundle(Path(bundle)).manifest["probe"] == "none" == \
            read_bundle(Path(bundle)).probe
    verify = ["--master-seed-file", str(tmp_path / "seed"), "--subset", "stratified",
              "--seeds", "1", "--workers", "1", "--no-progress"]
    # the onnx bundle with its manifest edited to the full arm is refused, naming both arms
    np_bundle = read_bundle(Path(bundles[0]))
    edited = {k: v for k, v in np_bundle.manifest.items() if k not in ("format", "files")}
    (tmp_path / "edited.finality").write_bytes(pack({**edited, "probe": "full"},
                                                    np_bundle.files))
    assert eval_cli(["verify", str(tmp_path / "edited.finality"), *verify, "--out",
                     str(tmp_path / "refused")]) == 2
    assert REFUSED.format(spec="bundle np (onnx:model.onnx)", arm="full") in \
        capsys.readouterr().err
    assert eval_cli(["verify", *bundles, *verify, "--out", str(tmp_path / "board")]) == 0
    board = tmp_path / "board"
    entries = {n: json.loads((board / "entries" / n / "entry.json").read_text()) for n in specs}
    for name, entry in entries.items():
        assert entry["status"] == "verified" and entry["protocol"]["probe"] == "none", name
        for split in ("public", "private"):
            assert json.loads((board / split / name / "run.json").read_text())["probe"] == "none"
            rows = read_rows(board / split / name / "episodes.jsonl")
            assert len(rows) == 48 and {row["probe"] for row in rows} == {"none"}
    assert eval_cli(["leaderboard", str(board), "--out", str(tmp_path / "site")]) == 0
    page = dom((tmp_path / "site" / "index.html").as_uri(), Recorder())
    groups = re.findall(r"<section [^>]*data-probe=.([a-z_]+).>", page)  # (quotes: chromium's)
    assert groups == ["none"]  # nothing of theirs on another arm
    ranking = re.search(r"<table class=\"ranking\">(.*?)</table>", page, re.S).group(1)
    assert sorted(re.findall(r'<tr data-entry="([^"]+)">', ranking)) == sorted(specs)
    publics = {n: entries[n]["public"]["mean_gap"] for n in ("gate", "sop")}
    best = min(publics, key=lambda n: (publics[n], n))
    assert re.search(r"<b data-gate[^>]*>gate</b>", page)  # (chromium writes data-gate="")
    assert re.search(rf"<b data-best-rule[^>]*>{best}</b>", page)


def test_a_bundle_names_a_known_arm_or_none(tmp_path):
    manifest = {"name": "gate", "kind": "scripted", "spec": "finality_gate"}
    assert bundle_of(pack(manifest, {}), "old").probe == "full"  # from before --probe
    with pytest.raises(BundleError, match="probe 'sideways'; valid: full, none, delayed"):
        bundle_of(pack({**manifest, "probe": "sideways"}, {}), "bad")


def test_a_model_without_metadata_is_graded_with_one_note(tmp_path, capsys):
    graph = tmp_path / "ppo_full.onnx"
    assert train_cli(["export", str(SHIPPED), "--onnx", str(graph)]) == 0
    assert "no training metadata" in capsys.readouterr().out
    assert read_archive(SHIPPED) is None and read_onnx(graph) is None
    for spec in (f"sb3:{SHIPPED}", f"onnx:{graph}"):
        out = tmp_path / spec.split(":")[0]
        assert eval_cli(["headline", "--policies", spec, "--probe", "none", *FAST, "--out",
                         str(out)]) == 0
        notes = [line for line in capsys.readouterr().err.splitlines() if "note:" in line]
        assert notes == [f"note: {spec} does not say what it was trained for (no training "
                         "metadata): graded on probe arm none, as declared"]
        assert {row["probe"] for row in read_rows(out / "episodes.jsonl")} == {"none"}
