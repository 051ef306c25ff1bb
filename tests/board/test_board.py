"""The leaderboard, end to end: bundles of three kinds (an outside policy file, an `onnx:` model, a
model entry served by the repository's chat server on 127.0.0.1) made by `eval submit`,
verified by `eval verify` on a private split into one board, published by `eval leaderboard`,
and the page read in headless chromium: its ranks, intervals and pairwise matrix must equal a
computation made here from the board's rows. A tampered and an unsafe bundle are refused
writing nothing; a bundle that fails mid-run gets an entry that says why (and names no private
case); a re-run of `verify` resumes without grading anything twice."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from eval.__main__ import main as eval_cli
from eval.board.bundle import pack, read_bundle
from eval.grading.runfolder import read_rows
from eval.stats.bootstrap import bootstrap_indices
from eval.stats.summary import BOOTSTRAP_SEED
from finality_gym.corpus import new_master_seed
from train.__main__ import main as train_cli

from tests.model.chat_server import ChatServer
from tests.site.test_view import Recorder, dom  # skips this module too where chromium is missing

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ["--subset", "stratified", "--seeds", "2", "--workers", "1", "--no-progress"]
PROBE_THEN_SHIP = '''from finality_gym.policy import Policy

class ProbeThenShip(Policy):
    name = "probe_then_ship"
    def plan(self):
        answer = yield ("probe_processor", {})
        yield ("ship", {}) if answer["captures"].get("cap1") == "settled" else ("refund", {})
'''
POLICY_BYTES = PROBE_THEN_SHIP.encode()
FAILS_ON_LARGE_ORDERS = '''from agents.scripted import FinalityGate

class Fussy(FinalityGate):
    name = "fussy"
    def plan(self):
        if self.brief.order_value >= 300000:
            raise RuntimeError(f"could not be loaded: no plan for {self.brief}")
        return super().plan()
'''


def _submit(*args) -> None:
    assert eval_cli(["submit", *map(str, args)]) == 0


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The bundles, the master seed, and one board verified from three of them."""
    base = tmp_path_factory.mktemp("board")
    (base / "seed").write_text(f"{new_master_seed()}\n")
    (base / "probe_then_ship.py").write_text(PROBE_THEN_SHIP)
    (base / "fussy.py").write_text(FAILS_ON_LARGE_ORDERS)
    assert train_cli(["export", str(ROOT / "models" / "ppo_full.zip"), "--onnx",
                      str(base / "ppo.onnx")]) == 0
    _submit(f"{base / 'probe_then_ship.py'}:ProbeThenShip", "--name", "probe", "--out",
            base / "probe.finality")
    _submit(f"onnx:{base / 'ppo.onnx'}", "--name", "ppo-onnx", "--out", base / "onnx.finality")
    _submit("model:scripted-model", "--name", "llm", "--price-in", "1", "--price-out", "4",
            "--out", base / "llm.finality")
    _submit(f"{base / 'fussy.py'}:Fussy", "--name", "fussy", "--out", base / "fussy.finality")
    os.environ["TEST_KEY"] = "test-key"
    with ChatServer(policy="finality_gate") as server:
        base_url = server.base_url
        assert eval_cli(["verify", *(str(base / f"{n}.finality") for n in ("probe", "onnx", "llm")),
                         "--master-seed-file", str(base / "seed"), "--out", str(base / "board"),
                         "--base-url", base_url, "--api-key-env", "TEST_KEY", *PROTOCOL]) == 0
    assert eval_cli(["leaderboard", str(base / "board"), "--out", str(base / "site")]) == 0
    return base


def _direct(board: Path, names: list[str]) -> dict:
    """Mean gaps, intervals, ranks and the pairwise matrix computed here from the private rows:
    units are twin pairs (or tasks) in order of first appearance, resampled as the board's
    statistics say they are."""
    rows = {n: read_rows(board / "private" / n / "episodes.jsonl") for n in names}
    units: dict[str, int] = {}
    for r in rows[names[0]]:
        units.setdefault(r["twin_id"] or r["task_id"], len(units))
    idx = bootstrap_indices(len(units), 2000, BOOTSTRAP_SEED)
    reps, means = {}, {}
    for n in names:
        num, den = np.zeros(len(units)), np.zeros(len(units))
        for r in rows[n]:
            u = units[r["twin_id"] or r["task_id"]]
            num[u] += r["gap"] / 100
            den[u] += 1
        means[n] = num.sum() / den.sum()
        reps[n] = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    q = lambda x: np.quantile(x, [0.025, 0.975])  # noqa: E731
    pairs = {(a, b): (means[a] - means[b], q(reps[a] - reps[b]),
                      np.mean((reps[a] < reps[b]) + 0.5 * (reps[a] == reps[b])))
             for a in names for b in names if a != b}
    return {"means": means, "intervals": {n: q(reps[n]) for n in names}, "pairs": pairs,
            "order": sorted(names, key=lambda n: (round(means[n], 6), n))}


def test_three_kinds_verified_into_one_board_and_the_page_equals_the_rows(made):
    names = ["probe", "ppo-onnx", "llm"]
    entries = {n: json.loads((made / "board" / "entries" / n / "entry.json").read_text())
               for n in names}
    assert {n: e["status"] for n, e in entries.items()} == dict.fromkeys(names, "verified")
    assert entries["probe"]["sandbox"]["tool"].startswith("bubblewrap")
    assert entries["llm"]["served_as"] == ["scripted-model"]
    assert {e["private"]["fingerprint"] for e in entries.values()} != {None}
    direct = _direct(made / "board", names)
    page = dom((made / "site" / "index.html").as_uri(), Recorder())
    ranking = re.search(r"<table class=\"ranking\">(.*?)</table>", page, re.S).group(1)
    shown = re.findall(r'<tr data-entry="([^"]+)"><td data-v="(\d+)">', ranking)
    assert shown == [(n, str(i + 1)) for i, n in enumerate(direct["order"])]
    for n in names:
        cell = re.search(rf'<tr data-entry="{n}">.*?<td data-v="([^"]+)" data-lo="([^"]+)" '
                         r'data-hi="([^"]+)" class="gap">', ranking, re.S)
        assert np.allclose([float(x) for x in cell.groups()],
                           [direct["means"][n], *direct["intervals"][n]], atol=1e-6), n
    matrix = re.search(r"<table class=\"pairwise\">(.*?)</table>", page, re.S).group(1)
    cells = re.findall(r'<td data-a="([^"]+)" data-b="([^"]+)" data-v="([^"]+)" data-lo="([^"]+)"'
                       r' data-hi="([^"]+)" data-p="([^"]+)">', matrix)
    assert len(cells) == 6
    for a, b, *numbers in cells:
        diff, (lo, hi), p = direct["pairs"][(a, b)]
        assert np.allclose([float(x) for x in numbers[:3]], [diff, lo, hi], atol=1e-6), (a, b)
        # a tie of two replicates' means may fall either way in floating point: one replicate
        assert abs(float(numbers[3]) - p) <= 1 / 2000 + 1e-9, (a, b)
    exact = re.search(r'<tr data-entry="probe">.*?<td data-v="([^"]+)"[^>]*class="exact">'
                      r'([^<]*)</td>', ranking, re.S)
    assert exact.group(2).startswith(f"{100 * float(exact.group(1)):.1f}% [")  # as every page
    assert re.search(r"\d%\]", exact.group(2))  # its interval in percent too
    provenance = page[page.index("<h2>Provenance</h2>"):]
    assert "sandbox: bubblewrap" in provenance and "seccomp filter" in provenance
    assert '{"tool"' not in provenance and "&quot;tool&quot;" not in provenance  # not raw JSON
    folders = b"".join(p.read_bytes() for p in (made / "site" / "episodes").rglob("*.js"))
    assert b'"sandbox":"bubblewrap' in folders  # the results site says it in the same words
    llm = re.search(r'<tr data-entry="llm">(.*?)</tr>', ranking, re.S).group(1)
    cost = np.mean([r["cost_microusd"] for r in
                    read_rows(made / "board" / "private" / "llm" / "episodes.jsonl")]) / 1e6
    assert f'data-v="{round(float(cost), 6)!r}"' in llm and cost > 0


def test_the_site_publishes_no_private_episode(made):
    private = {r["task_id"] for r in read_rows(made / "board" / "private" / "probe" /
                                                "episodes.jsonl")}
    assert private and all(t.startswith("pri-") for t in private)
    for path in (made / "site").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert b"pri-" not in data, f"{path} names a private task"
    assert (made / "site" / "episodes" / "index.html").is_file()  # the public episodes are there


def _repack(source: Path, out: Path, manifest_change=None, file_change=None) -> None:
    with zipfile.ZipFile(source) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        files = {n[len("policy/"):]: archive.read(n) for n in archive.namelist()
                 if n.startswith("policy/")}
    if file_change:  # the file changes, the manifest's hashes do not
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w") as archive:
            archive.writestr("manifest.json", json.dumps(manifest))
            for name, data in files.items():
                archive.writestr(f"policy/{name}", file_change(data))
        out.write_bytes(buffer.getvalue())
        return
    manifest_change(manifest)
    out.write_bytes(pack({k: v for k, v in manifest.items() if k not in ("format", "files")},
                         files))


def _bundle(files: dict, spec: str, kind: str = "outside", **fields) -> bytes:
    return pack({"name": "bad", "kind": kind, "spec": spec, **fields}, files)


# Each a bundle whose hashes are right but whose content is refused (what the refusal says).
CRAFTED = {
    # a package named as the grader's own, or the standard library's: first on the sandbox's
    # path, it would stand in for the host's own imports
    "shadowing": (lambda: _bundle({"agents/__init__.py": b"", "agents/mine.py": POLICY_BYTES},
                                  "agents.mine:ProbeThenShip"), "the grader's own package"),
    "stdlib": (lambda: _bundle({"secrets/__init__.py": POLICY_BYTES}, "secrets:ProbeThenShip"),
               "standard library"),
    # an extra file beside a model: on a worker's path it would be imported before the stdlib's
    "extra": (lambda: _bundle({"model.onnx": b"x", "multiprocessing/__init__.py": b""},
                              "onnx:model.onnx", kind="onnx"), "holds exactly the file"),
    "compiled": (lambda: _bundle({"pkg/__init__.py": POLICY_BYTES,
                                  "pkg/__pycache__/__init__.cpython-311.pyc": b"\0"},
                                 "pkg:ProbeThenShip"), "compiled code"),
    # a module the lookup would find in the grader's checkout, not in the bundle
    "outsider": (lambda: _bundle({"tests/README.txt": b""},
                                 "tests.grading.test_trust:ProbeThenShip"),
                 "already finds"),
    "nan": (lambda: _bundle({}, "finality_gate", kind="scripted",
                            claimed={"mean_gap": float("nan"), "exact": 0.5}), "not a number"),
    "file_and_folder": (lambda: _bundle({"pkg": b"", "pkg/x.py": b""}, "pkg.x:P"),
                        "plain relative name"),
}


@pytest.mark.parametrize("how", sorted(CRAFTED))
def test_a_crafted_bundle_is_refused_writing_nothing(made, tmp_path, capsys, how):
    make, said = CRAFTED[how]
    (tmp_path / "bad.finality").write_bytes(make())
    board = tmp_path / "board"
    assert eval_cli(["verify", str(tmp_path / "bad.finality"), "--master-seed-file",
                     str(made / "seed"), "--out", str(board), *PROTOCOL]) == 2
    assert said in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["bad.finality"]


@pytest.mark.parametrize("how", ["tampered", "unsafe", "escaping"])
def test_a_tampered_or_unsafe_bundle_is_refused_writing_nothing(made, tmp_path, capsys, how):
    bad = tmp_path / "bad.finality"
    if how == "tampered":
        _repack(made / "probe.finality", bad,
                file_change=lambda d: d.replace(b'("ship", {})', b'("refund", {})'))
        said = "tampered with"
    elif how == "unsafe":
        _repack(made / "probe.finality", bad,
                manifest_change=lambda m: m.update(trust_pickles=True))
        said = "unsafe"
    else:  # a file name that would land outside the bundle's folder
        up = b"/".join([b".."] * 2)  # the same length as the name it replaces
        data = (made / "probe.finality").read_bytes().replace(b"policy/probe_then_ship.py",
                                                              b"policy/" + up + b"/escaped_x.py")
        bad.write_bytes(data)
        said = "bundle"
    board = tmp_path / "board"
    assert eval_cli(["verify", str(bad), "--master-seed-file", str(made / "seed"), "--out",
                     str(board), *PROTOCOL]) == 2
    assert said in capsys.readouterr().err
    assert not board.exists() and sorted(os.listdir(tmp_path)) == ["bad.finality"]


class OwnActivation(torch.nn.ReLU):
    """An activation of the submitter's: SB3 saves it only as a pickle."""


def test_a_bundle_needing_the_unpickling_loader_is_refused_at_submit(tmp_path, capsys):
    import gymnasium as gym
    from stable_baselines3 import PPO

    import finality_gym  # noqa: F401  (registers the ids)
    model = PPO("MlpPolicy", gym.make("Finality-v0"), n_steps=8, batch_size=8, seed=0, device="cpu",
                policy_kwargs={"net_arch": [8], "activation_fn": OwnActivation})
    model.save(tmp_path / "silu.zip")
    assert eval_cli(["submit", f"sb3:{tmp_path / 'silu.zip'}", "--name", "silu", "--out",
                     str(tmp_path / "silu.finality")]) == 2
    assert "unpickling loader" in capsys.readouterr().err
    assert not (tmp_path / "silu.finality").exists()


def test_a_failing_bundle_gets_an_entry_and_a_rerun_resumes(made, tmp_path, capsys):
    board = tmp_path / "board"
    shutil.copytree(made / "board", board)
    entry = board / "entries" / "probe" / "entry.json"
    rows = board / "private" / "probe" / "episodes.jsonl"
    whole = rows.read_bytes()
    lines = whole.splitlines(keepends=True)
    rows.write_bytes(b"".join(lines[:len(lines) // 2]))  # a kill mid-run
    killed = json.loads(entry.read_text())
    killed["status"] = "grading"
    entry.write_text(json.dumps(killed))
    onnx_entry = (board / "entries" / "ppo-onnx" / "entry.json").read_bytes()
    refused = tmp_path / "refused.finality"  # refused for itself: the others are graded
    refused.write_bytes(CRAFTED["stdlib"][0]())
    assert eval_cli(["verify", str(made / "probe.finality"), str(refused),
                     str(made / "onnx.finality"), str(made / "fussy.finality"),
                     "--master-seed-file", str(made / "seed"), "--out", str(board),
                     *PROTOCOL]) == 2
    assert "refused, not graded" in capsys.readouterr().err
    assert not (board / "entries" / "bad").exists()
    assert rows.read_bytes() == whole  # completed, nothing lost or graded twice
    assert json.loads(entry.read_text())["status"] == "verified"
    assert (board / "entries" / "ppo-onnx" / "entry.json").read_bytes() == onnx_entry
    fussy = json.loads((board / "entries" / "fussy" / "entry.json").read_text())
    assert fussy["status"] == "failed" and "no plan for Brief(" in fussy["reason"]
    assert "pri-" not in fussy["public_reason"] and "-split case" in fussy["public_reason"]
    assert "Brief(" not in fussy["public_reason"]  # the policy's words are the operator's
    kept = {p: p.read_bytes() for p in board.glob("*/fussy/episodes.jsonl")}
    entry_bytes = (board / "entries" / "fussy" / "entry.json").read_bytes()
    assert eval_cli(["verify", str(made / "fussy.finality"), "--master-seed-file",
                     str(made / "seed"), "--out", str(board), *PROTOCOL]) == 0
    # a failure is final: its case is not played again (a policy could fail on purpose)
    assert kept and {p: p.read_bytes() for p in board.glob("*/fussy/episodes.jsonl")} == kept
    assert (board / "entries" / "fussy" / "entry.json").read_bytes() == entry_bytes
    assert eval_cli(["leaderboard", str(board), "--out", str(tmp_path / "site")]) == 0
    page = (tmp_path / "site" / "index.html").read_text()
    not_ranked = re.search(r"<table class='not-ranked'>(.*?)</table>", page, re.S).group(1)
    assert "fussy" in not_ranked and "failed" in not_ranked and "pri-" not in page
    assert "Brief(" not in page and "order_value" not in page


def test_another_bundle_under_a_verified_name_is_refused(made, tmp_path, capsys):
    board = tmp_path / "board"
    shutil.copytree(made / "board", board)
    before = sorted(p.relative_to(board) for p in board.rglob("*"))
    _repack(made / "probe.finality", tmp_path / "other.finality",
            manifest_change=lambda m: m.update(spec=m["spec"]))  # the same, repacked
    _submit("finality_gate", "--name", "probe", "--out", tmp_path / "gate.finality")
    assert eval_cli(["verify", str(tmp_path / "gate.finality"), "--master-seed-file",
                     str(made / "seed"), "--out", str(board), *PROTOCOL]) == 2
    assert "holds another bundle named 'probe'" in capsys.readouterr().err
    assert sorted(p.relative_to(board) for p in board.rglob("*")) == before
    assert read_bundle(tmp_path / "other.finality").sha256 == read_bundle(
        made / "probe.finality").sha256  # a bundle's bytes depend only on what it holds


def test_entries_of_another_grader_are_ranked_apart(made, tmp_path):
    board = tmp_path / "board"
    shutil.copytree(made / "board", board)
    path = board / "entries" / "ppo-onnx" / "entry.json"
    entry = json.loads(path.read_text())
    entry["grader"]["label"] = "0123456789ab"  # as if graded by another commit
    path.write_text(json.dumps(entry))
    assert eval_cli(["leaderboard", str(board), "--out", str(tmp_path / "site")]) == 0
    groups = json.loads((tmp_path / "site" / "board.json").read_text())["groups"]
    assert [sorted(e["name"] for e in g["entries"]) for g in groups] == [["llm", "probe"],
                                                                       ["ppo-onnx"]]
    assert "grader 0123456789ab" in groups[1]["key"] and "pairwise" in groups[1]
    assert all(" - ppo-onnx" not in pair for pair in groups[0]["pairwise"])  # never mixed


def test_each_arm_is_ranked_apart_in_the_arms_order_with_its_yardsticks(made, tmp_path):
    """An arm is another benchmark: an entry graded on another arm is its own group, groups
    come in the arms' order, and each names its gate and its best rule (on public) if entered."""
    board = tmp_path / "board"
    shutil.copytree(made / "board", board)
    edits = {"ppo-onnx": {"probe": "none"}, "probe": {"spec": "finality_gate"},
             "llm": {"spec": "react"}}
    for name, edit in edits.items():
        path = board / "entries" / name / "entry.json"
        entry = json.loads(path.read_text())
        entry["protocol"]["probe"] = edit.get("probe", entry["protocol"]["probe"])
        entry["spec"] = edit.get("spec", entry["spec"])
        path.write_text(json.dumps(entry))
    assert eval_cli(["leaderboard", str(board), "--out", str(tmp_path / "site")]) == 0
    groups = json.loads((tmp_path / "site" / "board.json").read_text())["groups"]
    assert [(g["probe"], sorted(e["name"] for e in g["entries"])) for g in groups] == [
        ("full", ["llm", "probe"]), ("none", ["ppo-onnx"])]
    assert groups[0]["key"].startswith("probe arm full") and groups[1]["gate"] is None
    publics = {n: json.loads((board / "entries" / n / "entry.json").read_text())["public"]
               ["mean_gap"] for n in ("probe", "llm")}
    assert groups[0]["gate"] == "probe"
    assert groups[0]["best_rule"] == min(publics, key=lambda n: (publics[n], n))
    page = (tmp_path / "site" / "index.html").read_text()
    none = page[page.index("data-probe='none'"):]
    assert "best scripted rule on the public split: not entered" in none
    assert "<b data-gate>probe</b>" in page[:page.index("data-probe='none'")]


def test_a_package_bundle_is_graded_from_its_own_files(made, tmp_path, monkeypatch):
    package = tmp_path / "src" / "probe_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "agent.py").write_text(PROBE_THEN_SHIP)
    (package / "__pycache__").mkdir()  # the submitter's own caches are left out
    (package / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"\0")
    monkeypatch.chdir(tmp_path / "src")  # where the submitter's package is importable
    _submit("probe_pkg.agent:ProbeThenShip", "--name", "pkg", "--out", tmp_path / "pkg.finality")
    monkeypatch.chdir(ROOT)
    shutil.rmtree(tmp_path / "src")  # verify grades the bundle's copy, nothing else
    assert sorted(read_bundle(tmp_path / "pkg.finality").files) == ["probe_pkg/__init__.py",
                                                                  "probe_pkg/agent.py"]
    assert eval_cli(["verify", str(tmp_path / "pkg.finality"), "--master-seed-file",
                     str(made / "seed"), "--out", str(tmp_path / "board"), *PROTOCOL]) == 0
    entry = json.loads((tmp_path / "board" / "entries" / "pkg" / "entry.json").read_text())
    assert entry["status"] == "verified" and "PYTHONPATH" not in os.environ
    rows = read_rows(tmp_path / "board" / "private" / "pkg" / "episodes.jsonl")
    probe = read_rows(made / "board" / "private" / "probe" / "episodes.jsonl")
    assert {r["policy"] for r in rows} == {"probe_pkg.agent:ProbeThenShip"}
    assert [r["gap"] for r in rows] == [r["gap"] for r in probe]  # the same policy, same play
