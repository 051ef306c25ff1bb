"""The private split cannot be guessed (docs/trust.md, "Leaderboard use and the private split"):
`python -m eval keygen` writes a master seed of 128 random bits to a new file of mode 0600; a
master seed below 2**127 (or from 2**256) is refused from every source, with the command that
makes a good one; the private split's ids are opaque (keyed by the seed: no archetype, no half,
no order of generation) and its twin pairs still pairs; the published splits are unchanged
(tests/env/test_corpus.py pins their fingerprints)."""

from __future__ import annotations

import json
import os
import random
import re
import stat
from argparse import Namespace

import pytest

from eval.__main__ import main
from eval.grading.grader import RunConfig
from eval.grading.master_seed import master_seed
from eval.grading.runfolder import read_rows
from finality_gym import load_corpus
from finality_gym.corpus import (MASTER_SEED_LIMIT, MASTER_SEED_MIN, PRIVATE, check_master_seed,
                                 generate, private_corpus)
from finality_gym.tasks import ARCHETYPES

# Two master seeds as `python -m eval keygen` makes them (128 random bits above bit 128).
SEED = 0x15a53fd62155a0eddba0eaab983604bb4
OTHER = 0x1e81bf9319406546e6b5059121104c8c9
KEYGEN = "python -m eval keygen --out FILE"
TASK_ID = re.compile(r"pri-[0-9a-f]{12}")
TWIN_ID = re.compile(r"pri-twin-[0-9a-f]{12}")


def keygen(path) -> int:
    return main(["keygen", "--out", str(path)])


# ----------------------------------------------------------------- keygen
def test_keygen_writes_a_new_file_of_mode_0600_and_prints_only_where(tmp_path, capsys):
    path = tmp_path / "master_seed"
    old = os.umask(0)  # the mode is keygen's own, not the umask's
    try:
        assert keygen(path) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    seed = int(text)
    assert text == f"{seed}\n"
    assert 1 << 128 <= seed < 1 << 129 and check_master_seed(seed) == seed
    out, err = capsys.readouterr()
    assert str(path) in out and str(seed) not in out + err
    assert f"--master-seed-file {path}" in out


def test_keygen_never_overwrites(tmp_path, capsys):
    path = tmp_path / "master_seed"
    assert keygen(path) == 0
    before = path.read_bytes()
    capsys.readouterr()
    assert keygen(path) == 2
    err = capsys.readouterr().err
    assert "exists" in err and "never overwrites" in err and "Traceback" not in err
    assert path.read_bytes() == before
    # nor follows a link planted where the seed goes
    target, link = tmp_path / "elsewhere", tmp_path / "link"
    link.symlink_to(target)
    assert keygen(link) == 2
    assert not target.exists()


def test_keygen_draws_128_random_bits_from_secrets(tmp_path):
    """Each of the 128 low bits takes both values over 64 draws (a draw of fewer random bits
    leaves the others fixed: odds of a false failure 128 * 2**-63), and seeding `random` does
    not repeat a draw (it is not the `random` module's)."""
    seeds = []
    for i in range(64):
        random.seed(0)
        assert keygen(tmp_path / f"seed{i}") == 0
        seeds.append(int((tmp_path / f"seed{i}").read_text()))
    assert len(set(seeds)) == 64
    assert all(s >> 128 == 1 for s in seeds)
    for bit in range(128):
        assert len({(s >> bit) & 1 for s in seeds}) == 2, bit


# ----------------------------------------------------------------- the rule
def test_the_rule_is_2_to_the_127_to_2_to_the_256():
    assert (MASTER_SEED_MIN, MASTER_SEED_LIMIT) == (2 ** 127, 2 ** 256)
    for good in (2 ** 127, SEED, 2 ** 256 - 1):
        assert check_master_seed(good) == good
    for bad in (0, 4242, 1729, 2718, 2 ** 63, 2 ** 64, 2 ** 127 - 1, 2 ** 256, -SEED):
        with pytest.raises(ValueError, match=re.escape(KEYGEN)) as raised:
            check_master_seed(bad)
        assert str(bad) not in str(raised.value)
    for bad in (True, float(SEED), str(SEED)):
        with pytest.raises(ValueError, match="must be an int"):
            check_master_seed(bad)


def test_a_low_seed_is_refused_by_the_library_too():
    with pytest.raises(ValueError, match=re.escape(KEYGEN)):
        private_corpus(4242)
    with pytest.raises(ValueError, match=re.escape(KEYGEN)):
        generate(PRIVATE, 2 ** 64)
    with pytest.raises(ValueError, match="generated from a master seed"):
        load_corpus(PRIVATE)  # nothing was made of them


@pytest.mark.parametrize("source", ["--master-seed", "--master-seed-file",
                                    "FINALITY_MASTER_SEED"])
@pytest.mark.parametrize("seed", [4242, 2 ** 64, 2 ** 127 - 1])
def test_a_low_seed_is_refused_from_every_source(tmp_path, capsys, monkeypatch, source, seed):
    monkeypatch.delenv("FINALITY_MASTER_SEED", raising=False)
    args = []
    if source == "--master-seed":
        args = ["--master-seed", str(seed)]
    elif source == "--master-seed-file":
        (tmp_path / "seed.txt").write_text(f"{seed}\n")
        args = ["--master-seed-file", str(tmp_path / "seed.txt")]
    else:
        monkeypatch.setenv("FINALITY_MASTER_SEED", str(seed))
    out = tmp_path / "run"
    assert main(["headline", "--split", "private", *args, "--out", str(out), "--no-progress",
                 "--seeds", "1", "--policies", "finality_gate"]) == 2
    printed = capsys.readouterr()
    assert KEYGEN in printed.err and source in printed.err and "2**127" in printed.err
    assert "Traceback" not in printed.err
    assert str(seed) not in printed.out + printed.err
    assert not out.exists()


@pytest.mark.parametrize("command", ["headline", "verify"])
def test_a_master_seed_on_the_command_line_is_refused_on_ray(tmp_path, capsys, monkeypatch,
                                                             command):
    """Ray keeps the driver's command line in the cluster's job table: refused before anything
    is started or written, the seed not echoed; the file form is accepted."""
    monkeypatch.delenv("FINALITY_MASTER_SEED", raising=False)
    out = tmp_path / "run"
    given = ["--policies", "finality_gate"] if command == "headline" else [str(tmp_path / "x")]
    assert main([command, *given, *(["--split", "private"] if command == "headline" else []),
                 "--master-seed", str(SEED), "--backend", "ray", "--out", str(out),
                 "--no-progress"]) == 2
    printed = capsys.readouterr()
    assert "--master-seed with --backend ray would put the seed in the Ray cluster's job " \
        "table" in printed.err
    assert str(SEED) not in printed.out + printed.err and not out.exists()
    assert master_seed(Namespace(master_seed=None, master_seed_file=None, backend="ray")) is None
    (tmp_path / "seed").write_text(f"{SEED}\n")
    assert master_seed(Namespace(master_seed=None, master_seed_file=tmp_path / "seed",
                                 backend="ray")) == SEED


def test_the_master_seed_is_read_whole_and_checked(tmp_path, monkeypatch):
    monkeypatch.delenv("FINALITY_MASTER_SEED", raising=False)
    file = tmp_path / "seed.txt"
    file.write_text(f"  {SEED}\n")
    assert master_seed(Namespace(master_seed=None, master_seed_file=file)) == SEED
    assert master_seed(Namespace(master_seed=SEED, master_seed_file=None)) == SEED
    monkeypatch.setenv("FINALITY_MASTER_SEED", str(OTHER))
    assert master_seed(Namespace(master_seed=None, master_seed_file=None)) == OTHER
    monkeypatch.delenv("FINALITY_MASTER_SEED")
    file.write_text("1" * 2000)
    with pytest.raises(ValueError, match="not a master seed"):
        master_seed(Namespace(master_seed=None, master_seed_file=file))


def test_a_keygen_seed_grades_the_private_split(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("FINALITY_MASTER_SEED", raising=False)
    path = tmp_path / "master_seed"
    assert keygen(path) == 0
    seed = int(path.read_text())
    ids = [t.task_id for t in generate(PRIVATE, seed)[:2]]
    capsys.readouterr()
    out = tmp_path / "run"
    assert main(["headline", "--split", "private", "--master-seed-file", str(path), "--out",
                 str(out), "--no-progress", "--seeds", "1", "--workers", "1", "--policies",
                 "finality_gate", "--tasks", ",".join(ids)]) == 0
    rows = read_rows(out / "episodes.jsonl")
    assert sorted(r["task_id"] for r in rows) == sorted(ids)
    printed = capsys.readouterr()
    assert str(seed) not in printed.out + printed.err
    for written in out.iterdir():
        assert str(seed).encode() not in written.read_bytes(), written
    fingerprint = json.loads((out / "summary.json").read_text())["fingerprint"]
    assert fingerprint == private_corpus(seed).fingerprint


# ----------------------------------------------------------------- opaque ids
def _ranks(keys: list[str]) -> list[int]:
    """Each item's place when `keys` are sorted."""
    ranks = [0] * len(keys)
    for rank, i in enumerate(sorted(range(len(keys)), key=keys.__getitem__)):
        ranks[i] = rank
    return ranks


def _correlation(ranks: list[int]) -> float:
    """Spearman's: the order of generation against the sorted order."""
    n = len(ranks)
    mean = (n - 1) / 2
    return (sum((i - mean) * (r - mean) for i, r in enumerate(ranks))
            / sum((i - mean) ** 2 for i in range(n)))


@pytest.mark.parametrize("seed", [SEED, OTHER])
def test_private_ids_name_no_archetype_half_or_place(seed):
    tasks = generate(PRIVATE, seed)
    ids = [t.task_id for t in tasks]
    assert len(set(ids)) == len(ids) == 321
    for task in tasks:
        assert TASK_ID.fullmatch(task.task_id), task.task_id
        assert not any(name in task.task_id for name in ARCHETYPES)
        assert task.twin_id is None or TWIN_ID.fullmatch(task.twin_id), task.twin_id
    # sorted, the ids are in no order of generation, and the archetypes are shuffled (in the
    # order of generation they run in 70 blocks; shuffled, in about 280)
    ranks = _ranks(ids)
    assert abs(_correlation(ranks)) < 0.2
    by_id = [tasks[i].archetype for i in sorted(range(len(ids)), key=ranks.__getitem__)]
    assert sum(a != b for a, b in zip(by_id, by_id[1:])) > 200
    # a pair's settling half sorts before its failing half about half the time, not always
    halves: dict[str, dict[str, str]] = {}
    for task in tasks:
        if task.twin_id is not None:
            halves.setdefault(task.twin_id, {})[task.twin_half] = task.task_id
    settle_first = sum(h["settle"] < h["fail"] for h in halves.values())
    assert 10 <= settle_first <= 35
    # and the twin ids are in no order of the pairs' generation
    assert abs(_correlation(_ranks(list(halves)))) < 0.4


def test_private_twin_pairs_are_still_pairs():
    tasks = generate(PRIVATE, SEED)
    pairs: dict[str, list] = {}
    for task in tasks:
        if task.twin_id is not None:
            pairs.setdefault(task.twin_id, []).append(task)
    assert len(pairs) == 45
    for twin_id, (a, b) in pairs.items():
        assert {a.twin_half, b.twin_half} == {"settle", "fail"}
        assert all(getattr(a, f) == getattr(b, f)
                   for f in ("order_value", "t_det", "retry_latency", "fault_key"))
        assert a.task_id != b.task_id and twin_id not in (a.task_id, b.task_id)
    kinds = {tuple(sorted(t.archetype for t in pair)) for pair in pairs.values()}
    assert kinds == {("pending_fail", "pending_settle"), ("unresolvable", "unresolvable")}
    corpus = private_corpus(SEED)
    assert len(corpus.units) == 276


def test_private_ids_are_stable_for_a_seed_and_keyed_by_it():
    first, again, other = generate(PRIVATE, SEED), generate(PRIVATE, SEED), generate(PRIVATE, OTHER)
    assert first == again
    assert private_corpus(SEED).fingerprint == private_corpus(SEED).fingerprint
    assert not {t.task_id for t in first} & {t.task_id for t in other}
    assert not {t.twin_id for t in first if t.twin_id} & {t.twin_id for t in other if t.twin_id}
    assert private_corpus(SEED).fingerprint != private_corpus(OTHER).fingerprint
    # the key is the seed: one bit of it moves every id
    near = generate(PRIVATE, SEED ^ 1)
    assert not {t.task_id for t in first} & {t.task_id for t in near}


def test_a_private_config_holds_its_corpus_and_changes_nothing_in_the_process():
    """The private corpus is the config's, passed explicitly: making a config (or grading with
    it) leaves no private split behind for `load_corpus` to hand to anyone else."""
    config = RunConfig(("finality_gate",), split=PRIVATE, seeds=(0,), master_seed=SEED)
    assert config.corpus.fingerprint == private_corpus(SEED).fingerprint
    assert config.corpus.fingerprint != RunConfig(("finality_gate",), split=PRIVATE, seeds=(0,),
                                                  master_seed=OTHER).corpus.fingerprint
    with pytest.raises(ValueError, match="generated from a master seed"):
        load_corpus(PRIVATE)
