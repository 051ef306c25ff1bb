"""`python -m eval verify BUNDLE... --master-seed-file F --out BOARD`: every bundle graded again by
this grader, on the private split (and the public one), into one board.

    BOARD/entries/NAME/entry.json     what the entry is and how it was graded (below)
    BOARD/entries/NAME/policy/        the bundle's files, as graded
    BOARD/private/NAME/               its private-split run folder (the operator's eyes only)
    BOARD/public/NAME/                its public-split run folder (the site links into it)

Every bundle is read and checked whole, and loaded in the safe form, before anything is written:
a tampered, unsafe, oversized or unloadable bundle is refused with its reason (printed; the exit
status is 2) and the other bundles are graded; where every bundle is refused the board is left
as it was. Then each entry is graded through the shared grader (outside code in the sandbox, a saved
model as data, a model entry through the operator's `--base-url`), the public split first and
then the private one (what the page shows of its play is made before its private cases run,
and the page never shows its words: `_graded`), resumable: a re-run grades
only what a killed run left missing. An entry verified or failed is final (a re-run leaves it
alone: a policy that failed on purpose does not get its case again; an operator who wants a
failed entry graded anew removes its `entries/NAME`, `private/NAME` and `public/NAME`). A
bundle under a name the board holds for another bundle, or for an entry begun under another
grader version, master seed or protocol, is refused.

`entry.json` holds `status` (`verified`; `failed`: the policy failed, `reason` in its own
words for the operator, `public_reason` for the page: fixed text, never the policy's words,
which could carry what one of its private cases learned: `_graded`;
`incomplete`: the endpoint failed, which is not the entry's failure: re-run), the bundle's
SHA-256, `protocol` (seeds, subset, probe arm, tasks), `private` (the split's fingerprint, never
its seed), `public` (its figures with intervals, and `claim_outside`: the author's claimed
figures that fall outside their interval), `grader` (`provenance.grader_version`), `form` and, for
outside code, `sandbox` (the layers the sandbox's self-test proved; with `--backend ray` also
`sandbox_nodes`, those it proved on each node of the cluster), for a model entry
`served_as` (the names its endpoint answered under), and `machine`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from agents import PolicyError, is_unprivileged_scripted
from agents.sandbox.external import PolicyLoadError
from finality_gym import load_corpus
from finality_gym.corpus import PRIVATE, private_corpus

import eval.grading.runfolder as runfolder
from eval.board.bundle import Bundle, BundleError, read_bundle
from eval.board.loading import check_loads, is_package, located, model_config
from eval.board.provenance import FORMS, grader_version
from eval.grading.distributed import connect, require_ray
from eval.grading.grader import BACKENDS, Incomplete, RunConfig, grade
from eval.grading.master_seed import master_seed, seed_options
from eval.models.arm import grade_model, read_transcript, stratified_subset
from eval.stats.summary import summarize
from eval.sweeps.provenance import machine

ENTRIES = "entries"
ENTRY = "entry.json"
SUBSETS = ("all", "stratified")


def _entry(board: Path, name: str) -> Path:
    return board / ENTRIES / name


def run_folder(board: Path, split: str, name: str) -> Path:
    """An entry's run folder of one split (`private` or `public`)."""
    return board / split / name


def _recorded(board: Path, name: str) -> dict | None:
    path = _entry(board, name) / ENTRY
    return json.loads(path.read_text()) if path.is_file() else None


def check_all(paths: list[Path], board: Path, grader: dict, base_url: str | None,
              settings: dict, backend: str = "local") -> tuple[list[tuple[Path, str]], list[str]]:
    """Every bundle read, checked and loaded, and each fit for the board (`settings`: the
    protocol and the private split's fingerprint an entry already there must share), before
    anything is written. Returns the accepted bundles, each with the SHA-256 `verify` holds it
    to when it reads it again to grade it, and the refusals: a bundle refused for itself
    (tampered, unsafe, over a limit, does not load: `BundleError`; with `backend` ray, a
    package, whose folder Ray would need on its nodes' import path) is left out with its reason
    and the others go on; an operator's error (two bundles of one name, a model entry without
    `--base-url`, a clash with the board) stops the run, as does a run where every bundle was
    refused. One bundle is held in memory at a time (each may hold up to `MAX_BYTES`)."""
    names, accepted, refused = [], [], []
    for path in paths:
        try:
            bundle = read_bundle(path)
        except BundleError as exc:
            refused.append(str(exc))
            continue
        names.append(bundle.name.casefold())  # one folder each, on any file system
        if names.count(names[-1]) > 1:
            raise ValueError(f"two bundles are named {names[-1]!r} (letter case aside)")
        try:
            check_loads(bundle)
        except BundleError as exc:
            refused.append(str(exc))
            continue
        if backend == "ray" and is_package(bundle):
            refused.append(f"bundle {bundle.name}: a package ({bundle.spec}) is verified with "
                           "--backend local: on Ray its folder would have to be on every "
                           "node's import path, where Ray's own imports would find it too")
            continue
        if bundle.kind == "model" and base_url is None:
            raise ValueError(f"bundle {bundle.name} is a model entry: give --base-url (and "
                             "--api-key-env) of the endpoint that serves it")
        old = _recorded(board, bundle.name)
        if old is not None:
            _fits(board, bundle, old, grader, settings)
        accepted.append((path, bundle.sha256))
    if not accepted:
        raise ValueError("\n".join(refused))
    return accepted, refused


def _fits(board: Path, bundle: Bundle, old: dict, grader: dict, settings: dict) -> None:
    """A bundle under a name the board holds is the bundle the entry was begun with, under this
    grader and these settings, or a `ValueError` (the operator's error: it stops the run)."""
    where = _entry(board, bundle.name)
    if old["bundle_sha256"] != bundle.sha256:
        raise ValueError(f"{where} holds another bundle named {bundle.name!r} (sha256 "
                         f"{old['bundle_sha256'][:12]}...); give this one another name, or "
                         "another --out")
    if old["status"] == "grading" and old["grader"]["label"] != grader["label"]:
        raise ValueError(f"{bundle.name}: its grading began under grader "
                         f"{old['grader']['label']}, this is {grader['label']}: finish it "
                         "with that grader, or verify into another --out (rows of two "
                         "graders are never mixed)")
    was = {"protocol": {k: old["protocol"][k] for k in ("seeds", "subset")},
           "fingerprint": old["private"]["fingerprint"]}
    if was != settings:
        raise ValueError(f"{where} was graded under {was}, not {settings} (another "
                         "--seeds, --subset or master seed): verify into another --out")


def _read_again(path: Path, checked: str) -> Bundle:
    """The bundle at `path` read again to be graded, and the one `check_all` checked."""
    bundle = read_bundle(path)
    if bundle.sha256 != checked:
        raise ValueError(f"bundle {path} changed since it was checked (sha256 {checked[:12]}..., "
                         f"now {bundle.sha256[:12]}...): verify it again")
    return bundle


def _configs(spec: str, name: str, seeds: int, subset: str, seed: int, probe: str
             ) -> dict[str, RunConfig]:
    """The private and the public split's run, of the spec that loads the bundle's files
    (`loading.located`), its rows named as the bundle names it, on the bundle's probe arm."""
    private = private_corpus(seed)
    # The public split first: what the page shows of an entry's play (its public rows) is then
    # made before any case of its own private split has run.
    subsets = {"public": stratified_subset("public") if subset == "stratified" else None,
               PRIVATE: stratified_subset(private) if subset == "stratified" else None}
    return {split: RunConfig((spec,), split=split, seeds=tuple(range(seeds)), tasks=tasks,
                             probe=probe, master_seed=seed if split == PRIVATE else None,
                             names=(name,))
            for split, tasks in subsets.items()}


def _grade(bundle: Bundle, config: RunConfig, out: Path, args: argparse.Namespace) -> list:
    if bundle.kind == "model":
        model = model_config(bundle, args.base_url, args.api_key_env, args.timeout)
        return grade_model(model, config, out, args.concurrency, not args.no_progress)
    return grade(config, out, workers=args.workers, progress=not args.no_progress,
                 desc=f"{bundle.name} {config.split}", backend=args.backend)


def claim_check(claimed: dict | None, figures: dict) -> list[str]:
    """The claimed figures that fall outside their public-split interval."""
    return [f"{k}: claimed {claimed[k]:g}, graded {figures[k]:g} "
            f"[{figures[k + '_ci'][0]:g}, {figures[k + '_ci'][1]:g}]"
            for k in sorted(claimed or {}) if not
            figures[k + "_ci"][0] <= claimed[k] <= figures[k + "_ci"][1]]


def _extracted(bundle: Bundle, folder: Path) -> Path:
    """The bundle's files in `folder/policy` (extracted whole, or not at all), an absolute
    path."""
    policy = folder / "policy"
    if not policy.is_dir():
        scratch = folder / f".policy-{os.getpid()}"
        shutil.rmtree(scratch, ignore_errors=True)
        bundle.extract(scratch)
        os.rename(scratch, policy)
    return policy.resolve()


def _new_entry(bundle: Bundle, configs: dict, grader: dict, where: dict, seeds: int,
               subset: str) -> dict:
    spec = bundle.spec
    return {"name": bundle.name, "kind": bundle.kind, "spec": spec,
            "privileged": bundle.kind == "scripted" and not is_unprivileged_scripted(spec),
            "bundle_sha256": bundle.sha256, "status": "grading", "reason": None,
            "public_reason": None,
            "protocol": {"seeds": list(range(seeds)), "subset": subset, "probe": bundle.probe,
                         "tasks": len({t for t, _ in configs[PRIVATE].cases()})},
            "private": {"fingerprint": configs[PRIVATE].corpus.fingerprint},
            "public": {"fingerprint": configs["public"].corpus.fingerprint},
            "claimed": bundle.manifest.get("claimed"), "grader": grader,
            "form": FORMS[bundle.kind], "machine": where,
            **({"model": bundle.manifest["model"]} if bundle.kind == "model" else {})}


def _graded(bundle: Bundle, board: Path, policy: Path, entry: dict,
            args: argparse.Namespace) -> dict[str, list]:
    """Grade both splits into the entry's run folders; the entry's status (and why) set from
    how it ended. A policy that fails is a result; what the page says of it is fixed text, never
    the policy's own words: once grading began, its code has run in cases of a private split
    (its own, or another entry's before it), and what a later import or case says could carry
    what one of them learned (a load failure's words were published once, and carried private
    cases read back through the page cache). Its words are the operator's (`reason`); a bundle
    that does not load at all is refused before grading, in its words (`check_all`)."""
    graded: dict[str, list] = {}
    try:
        with located(bundle, policy) as spec:
            configs = _configs(spec, bundle.spec, args.seeds, args.subset, args.master_seed,
                               bundle.probe)
            for split, config in configs.items():
                graded[split] = _grade(bundle, config, run_folder(board, split, bundle.name),
                                       args)
    except Incomplete as exc:
        entry.update(status="incomplete", reason=str(exc),
                     public_reason="the endpoint failed (not the entry's failure): re-run")
    except PolicyLoadError as exc:  # it loaded when checked: now it does not
        entry.update(status="failed", reason=str(exc), public_reason=(
            "its code could not be loaded when graded, though it loaded when checked (its "
            "words are the operator's)"))
    except PolicyError as exc:
        split = "public" if "public" not in graded else PRIVATE
        entry.update(status="failed", reason=str(exc), public_reason=(
            f"the policy failed on a {split}-split case (its words, which may name the case, "
            "are the operator's)"))
    else:
        entry["status"] = "verified"
    return graded


def verify_one(bundle: Bundle, board: Path, grader: dict, where: dict,
               args: argparse.Namespace) -> dict:
    """Grade one bundle into its entry (resuming an entry a killed run left); return its
    entry.json. An entry verified or failed is final: it is returned as it is."""
    folder = _entry(board, bundle.name).resolve()
    recorded = _recorded(board, bundle.name)
    if recorded is not None and recorded["status"] in ("verified", "failed"):
        return recorded
    policy = _extracted(bundle, folder)
    configs = _configs(bundle.spec, bundle.spec, args.seeds, args.subset, args.master_seed,
                       bundle.probe)
    entry = _new_entry(bundle, configs, grader, where, args.seeds, args.subset)
    runfolder.write_atomic(folder / ENTRY, json.dumps(entry, indent=2) + "\n")
    graded = _graded(bundle, board, policy, entry, args)
    rows = run_folder(board, PRIVATE, bundle.name) / runfolder.ROWS
    entry["private"]["episodes"] = (len(graded[PRIVATE]) if PRIVATE in graded else
                                    len(runfolder.read_rows(rows)) if rows.is_file() else 0)
    if bundle.kind == "model":  # the names the endpoint answered under, from the transcripts
        entry["served_as"] = sorted({line["served_model"] for split in configs for path in
                                     (run_folder(board, split, bundle.name) /
                                      runfolder.TRANSCRIPTS).glob("*.jsonl")
                                     for line in read_transcript(path)
                                     if line.get("served_model")})
    run = run_folder(board, PRIVATE, bundle.name) / runfolder.MANIFEST
    pinned = json.loads(run.read_text()) if run.is_file() else {}
    entry.update({k: pinned[k] for k in ("sandbox", "sandbox_nodes") if k in pinned})
    if "public" in graded:
        name = bundle.spec
        summary = summarize(graded["public"], load_corpus("public"), [name],
                            entry["protocol"]["seeds"])["policies"][name]
        figures = {k: summary[k] for k in ("mean_gap", "mean_gap_ci", "exact", "exact_ci")}
        entry["public"].update(figures, episodes=len(graded["public"]),
                               claim_outside=claim_check(entry["claimed"], figures))
    entry["verified_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    runfolder.write_atomic(folder / ENTRY, json.dumps(entry, indent=2) + "\n")
    return entry


def verify(paths: list[Path], board: Path, args: argparse.Namespace
           ) -> tuple[list[dict], list[str]]:
    """Check every bundle, then grade each accepted one into `board`; return their entries and
    the refusals (each printed as it is found)."""
    if args.master_seed is None:
        raise ValueError("verify grades the private split: give --master-seed-file (or "
                         "FINALITY_MASTER_SEED)")
    if args.seeds < 1 or args.subset not in SUBSETS:
        raise ValueError(f"--seeds must be at least 1 and --subset one of {SUBSETS}")
    if args.backend == "ray":  # Ray missing: an error now, before anything is written; and
        require_ray()  # joined (or started, with none of a bundle's environment) before any
        connect()      # bundle is read, so that nothing a bundle sets reaches a Ray process
    board = board.resolve()
    grader = grader_version()
    settings = {"protocol": {"seeds": list(range(args.seeds)), "subset": args.subset},
                "fingerprint": private_corpus(args.master_seed).fingerprint}
    accepted, refused = check_all(paths, board, grader, args.base_url, settings, args.backend)
    for reason in refused:
        print(f"verify: refused, not graded: {reason}", file=sys.stderr)
    runfolder.prepare(board)
    where = machine()
    with runfolder.lock(board):
        return [verify_one(_read_again(path, digest), board, grader, where, args)
                for path, digest in accepted], refused


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundles", nargs="+", type=Path, metavar="BUNDLE")
    parser.add_argument("--out", type=Path, required=True,
                        help="the board (re-running into it resumes)")
    seed_options(parser)
    parser.add_argument("--seeds", type=int, default=5, help="episode seeds 0..N-1 (default 5)")
    parser.add_argument("--subset", choices=SUBSETS, default="all",
                        help="every task (default), or the model arm's 48 stratified tasks of "
                             "each split (a cheaper board: its entries are ranked apart)")
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes, or Ray tasks in flight (default 2)")
    parser.add_argument("--backend", choices=BACKENDS, default="local",
                        help="where the cases run: worker processes here (default), or Ray tasks "
                             "on the cluster RAY_ADDRESS names (else a Ray started here), on the "
                             "nodes checked first (each sees the bundles' files here, on a shared "
                             "filesystem; its sandbox self-tested); each node sees the private "
                             "cases it grades: a cluster you trust with the split. Model entries "
                             "are played from here, in threads")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    model = parser.add_argument_group("model entries: the endpoint that serves them")
    model.add_argument("--base-url", default=None, help="an OpenAI-compatible endpoint")
    model.add_argument("--api-key-env", default=None, help="the variable holding its key")
    model.add_argument("--concurrency", type=int, default=1, help="episodes in flight")
    model.add_argument("--timeout", type=float, default=120.0, help="seconds a request attempt")


def main(args: argparse.Namespace) -> int:
    args.master_seed = master_seed(args)
    entries, refused = verify(args.bundles, args.out, args)
    for e in entries:
        said = e["public_reason"] or ", ".join(e["public"].get("claim_outside", [])) or ""
        print(f"{e['name']:<24} {e['status']:<10} {e['private'].get('episodes', 0):>6} private "
              f"episodes  {said}")
    print(f"verify: board {args.out}; publish it with python -m eval leaderboard {args.out} "
          "--out SITE")
    return (3 if any(e["status"] == "incomplete" for e in entries) else
            2 if refused else 0)
