"""The graded runs a site shows (`discover`): every folder under each DIR that holds
`episodes.jsonl` beside `run.json`, read whole (through `Tree`, following no link) and checked
before anything is written: each row's checksum, that its rows and summary are of the split its
run.json names (a site of a published split must not publish another's tasks), that its
figures are pictures, and that it pinned a world its episodes can be rebuilt in."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from finality_gym import load_corpus
from finality_gym.corpus import PRIVATE, SPLITS

from eval.grading.runfolder import MANIFEST, ROWS, SUMMARY, TRANSCRIPTS, rows_of, transcript_name
from eval.site.replays import World
from eval.site.transcripts import conversation
from eval.site.tree import Tree

PNG = b"\x89PNG\r\n\x1a\n"
# What the build takes from every row: one without them is not a graded episode of this grader.
ROW_KEYS = ("policy", "task_id", "archetype", "twin_id", "twin_half", "seed", "disposition",
            "lapsed", "premature", "gap", "label", "calls_used", "end_t")


@dataclass(frozen=True)
class Folder:
    """One graded run of the site: where it is, what it pinned, its rows, and everything else
    of it the site shows (read and checked before anything is written)."""

    name: str
    path: Path
    manifest: dict
    rows: list
    world: World                 # its run.json's world, to rebuild its episodes in
    summary: dict | None = None  # its summary.json, where it has one
    figures: tuple = ()          # (file name, PNG bytes) of its own figures
    conversations: dict = field(default_factory=dict)  # transcript name -> its page's JSON

    @property
    def private(self) -> bool:
        return self.world.private

    @property
    def self_reported(self) -> bool:
        """An imported log's run (`eval import-inspect`): its run.json, or its summary, says
        so."""
        return (self.manifest.get("self_reported") is True
                or (self.summary or {}).get("self_reported") is True)


def _json(data: bytes, path: Path) -> object:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is corrupt ({exc})") from None


def _rows(data: bytes, path: Path) -> list[dict]:
    """The complete, verified rows of an episodes file's bytes (`runfolder.rows_of`), each
    holding what the site shows of an episode."""
    rows = rows_of(data, path)
    for number, row in enumerate(rows, 1):
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path}:{number} is not a graded episode (it has no "
                             f"{', '.join(missing)})")
    return rows


def _check_split(path: Path, manifest: dict, rows: list[dict]) -> None:
    """A run of a published split holds only that split's tasks, under its fingerprint; a run
    that says it is private is kept for `--private` (its tasks need its master seed)."""
    split, fingerprint = manifest.get("split"), manifest.get("fingerprint")
    if not isinstance(split, str) or not isinstance(fingerprint, str):
        raise ValueError(f"{path / MANIFEST} names no split and fingerprint: not a run this "
                         "grader wrote")
    if split == PRIVATE:
        return
    if split not in SPLITS:
        raise ValueError(f"{path / MANIFEST} names split {split!r}, which is neither a "
                         f"published split ({', '.join(SPLITS)}) nor {PRIVATE!r}")
    corpus = load_corpus(split)
    if fingerprint != corpus.fingerprint:
        raise ValueError(f"{path / MANIFEST} names split {split} with fingerprint {fingerprint}"
                         f", but {split}'s is {corpus.fingerprint}: its rows were graded on "
                         "other tasks; a run of the private split must say so (`\"split\": "
                         "\"private\"`, and --private to show it)")
    for number, row in enumerate(rows, 1):
        task = corpus.by_id.get(row["task_id"])
        if task is None:
            raise ValueError(f"{path / ROWS}:{number}: task {row['task_id']!r} is not a task of "
                             f"split {split} (fingerprint {fingerprint}), which {MANIFEST} "
                             "names: the folder holds rows of another split (the private "
                             f"one's?), which the site would publish as {split}'s; refused")
        if (row["archetype"], row["twin_id"], row["twin_half"]) != (
                task.archetype, task.twin_id, task.twin_half):
            raise ValueError(f"{path / ROWS}:{number}: the row's archetype and twin are not "
                             f"those of {split}'s task {task.task_id}: a row of another split; "
                             "refused")


def _summary(tree: Tree, rel: tuple[str, ...], manifest: dict) -> dict | None:
    """The run's summary.json, where it has one of its own split (another split's figures,
    which the index would show as this split's, are refused)."""
    path = tree.path(rel)
    if SUMMARY not in tree.listing[rel].files:
        return None
    summary = _json(tree.read(rel + (SUMMARY,)), path / SUMMARY)
    if not isinstance(summary, dict) or not isinstance(summary.get("policies"), dict):
        return None
    if manifest["split"] != PRIVATE and any(
            k in summary and summary[k] != manifest[k] for k in ("split", "fingerprint")):
        raise ValueError(f"{path / SUMMARY} is a summary of split {summary.get('split')} "
                         f"(fingerprint {summary.get('fingerprint')}), not of the run "
                         f"{MANIFEST} names ({manifest['split']}, "
                         f"{manifest['fingerprint']}); refused")
    return summary


def _figures(tree: Tree, rel: tuple[str, ...]) -> tuple:
    """The run's own figures, (file name, PNG bytes): a `.png` that is not one is refused, as
    the site would publish it as a figure."""
    figures = []
    for file in sorted(f for f in tree.listing[rel].files if f.endswith(".png")):
        data = tree.read(rel + (file,))
        if not data.startswith(PNG):
            raise ValueError(f"{tree.path(rel) / file} is not a PNG picture; the site would "
                             "publish it as a figure: remove or rename it")
        figures.append((file, data))
    return tuple(figures)


def _conversations(tree: Tree, rel: tuple[str, ...], rows: list[dict]) -> dict:
    """The model episodes' transcripts the run holds, as their pages' JSON, by file name."""
    conversations = {}
    held = tree.listing.get(rel + (TRANSCRIPTS,))
    for row in rows:
        source = transcript_name(row["task_id"], row["seed"])
        if (row["policy"].startswith("model:") and held is not None and source in held.files
                and source not in conversations):
            where = rel + (TRANSCRIPTS, source)
            conversations[source] = json.dumps(
                conversation(tree.read(where), tree.path(where)), separators=(",", ":"))
    return conversations


def _read_run(tree: Tree, rel: tuple[str, ...], name: str) -> Folder:
    """One run folder, read whole and checked: run.json (its split and the world it pinned),
    its rows (checksums, split), its summary, its figures and its model episodes'
    transcripts."""
    path = tree.path(rel)
    manifest = _json(tree.read(rel + (MANIFEST,)), path / MANIFEST)
    if not isinstance(manifest, dict):
        raise ValueError(f"{path / MANIFEST} is corrupt (not a JSON object)")
    rows = _rows(tree.read(rel + (ROWS,)), path / ROWS)
    _check_split(path, manifest, rows)
    try:
        world = World(manifest)
    except ValueError as exc:
        raise ValueError(f"{path / MANIFEST}: {exc}") from None
    return Folder(name, path, manifest, rows, world, _summary(tree, rel, manifest),
                  _figures(tree, rel), _conversations(tree, rel, rows))


def discover(dirs: list[Path]) -> list[Folder]:
    """Every graded run under each of `dirs`, in path order, read whole and checked; a DIR that
    holds none, a link or anything else not a regular file or folder under it, a row that fails
    its checksum or is not of its run's split, is an error that names it (and nothing is
    written)."""
    found: dict[tuple, Folder] = {}
    for top in dirs:
        tree = Tree(top)
        try:
            listing = tree.walk()
            runs = sorted(rel for rel, d in listing.items()
                          if ROWS in d.files and MANIFEST in d.files)
            if not runs:
                raise ValueError(f"{top} holds no graded run (a folder with {ROWS} and "
                                 f"{MANIFEST})")
            for rel in runs:
                if listing[rel].ident in found:
                    continue
                name = "/".join(p for p in (top.resolve().name, *rel) if p) or top.name or "/"
                found[listing[rel].ident] = _read_run(tree, rel, name)
        finally:
            tree.close()
    return list(found.values())
