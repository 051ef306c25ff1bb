"""`python -m eval view`: every graded episode of one or more results folders, as a static site.

    python -m eval view DIR [DIR ...] [--out SITE] [--pictures some|all|none]
                        [--serve [--port P]]

Every folder under each DIR that holds a graded run (`episodes.jsonl` beside `run.json`: a
headline, an experiment's runs, a model arm and its `scripted/` line-up, a sweep's
`seed_K/eval_SPLIT`) becomes one section of `SITE` (default `results/site`):

- `index.html`: each folder's policies with their headline figures (from its `summary.json`,
  or computed from its rows where it has none), sortable; the per-archetype breakdown; the
  folder's own figures; a model's requests, tokens and cost; and, where model runs were given
  prices, one figure of every such run's mean gap against its cost per episode.
- `episodes.html#f=F&...`: every episode in a table, filtered (policy, archetype, label, twin
  pair, lapsed) and sorted by gap; the filter is in the address, so a view can be shared.
- `episode.html#f=F&p=P&t=TASK&s=SEED`: the episode that was graded, not a replay of the policy:
  the engine rebuilds it from the task, the seed and the calls the grader recorded
  (`finality_gym.episode.replay`; the rebuilt record must equal the graded one, and the page
  says so), and shows its timeline picture, every call with its arguments and result, the loss
  breakdown, a model's whole conversation, and links to the other half of a twin pair and to
  the same case under every other policy of the site.
- `compare.html#f=F&t=TASK&s=SEED&a=P&b=Q`: two policies on the same case, calls aligned on
  the clock.

The site is self-contained: its pages, one script and one style sheet, and data files loaded
as scripts when a page needs them (a browser does not let a `file://` page fetch files, but it
runs scripts), so it opens from disk and nothing is fetched from the network. What a page
needs is split so that it stays fast on a headline folder (14,445 episodes): the index reads
only the summaries, the episodes table one file of compact rows per folder, an episode page
the file of its task.

Pictures (`finality_gym.timeline.draw`, 1280 x 800) are drawn at build time for the episodes
that matter (`--pictures some`: every model episode and the `WORST` episodes of largest gap of
each policy), for all (`all`: ~140 KB and ~0.8 s of a core each) or none; `--serve` draws any other on
the first request and keeps it. Folders graded before the grader recorded calls are shown
too: their episodes get pages without calls or picture, which say why. A run of the private
split is refused unless `--private` is given (a site is made to be published, and it would
publish the hidden tasks); its episodes are then shown but not rebuilt (that needs the master
seed).

What a site publishes is only what it should (docs/results.md, "The results site"):

- Only regular files are read, and no link is followed: each DIR is opened, walked and read
  through file descriptors (`O_NOFOLLOW` at every step, `S_ISREG` for a file), and a symbolic
  link, fifo, socket or device anywhere under it is refused, naming it, rather than skipped.
- A run is private unless its rows show otherwise: a run of `public` or `regenerated` must
  name that split's fingerprint, and every row's task must be one of that split's tasks (with
  its archetype and twin), so rows of another split under a public `run.json` are refused,
  whatever their ids look like; a `summary.json` of another split likewise.
- Everything is read and checked before `--out` is touched; the site is then written into a
  new folder beside it, which replaces `--out` only once complete, so a failure at any point
  leaves `--out` as it was.
- `--serve` hands the site only to the page it printed: the address holds a token drawn for
  the run (`http://127.0.0.1:PORT/TOKEN/index.html`), a request without it is answered 404,
  and one whose `Host` is not `127.0.0.1:PORT` or `localhost:PORT` 421 (no DNS rebinding);
  every answer says `Cross-Origin-Resource-Policy: same-origin`. `--serve --private` is allowed
  on these terms (the token is then the key to the private rows).
- A run whose `run.json` says `"self_reported": true` (an imported inspect log) is marked
  self-reported on the index and on each of its pages; a run of a published split is marked a
  development figure on the index.
"""

from __future__ import annotations

import argparse
import hmac
import html
import json
import multiprocessing
import os
import re
import secrets
import shutil
import stat
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from agents.model import REMINDER
from finality_gym import load_corpus
from finality_gym.corpus import PRIVATE, SPLITS
from finality_gym.economics import Costs
from finality_gym.episode import replay
from finality_gym.faults import FaultProfile

from .runfolder import MANIFEST, ROWS, _verified
from .summary import summarize

DEFAULT_OUT = Path("results") / "site"
PICTURES = ("some", "all", "none")
WORST = 5            # pictures drawn per policy of a folder with `--pictures some`
MARKER = ".finality-site"  # an earlier site in --out, which a build may replace
ASSETS = Path(__file__).parent / "site"
PAGES = {"index": "Results", "episodes": "Episodes", "episode": "Episode",
         "compare": "Side by side"}
RECORD = ("disposition", "lapsed", "premature", "calls_used", "end_t", "order_value", "cash",
          "goods_left", "escalated", "position", "reference", "gap", "cogs", "liability",
          "dispute", "escalation", "label")
MODEL_FIELDS = ("requests", "replayed", "retries", "invalid_turns", "tokens_in", "tokens_out",
                "tokens_reasoning", "tokens_cached", "cost_microusd", "agent_status")
# The compact rows of the episodes table, one array each, in this order.
COLUMNS = ("p", "task", "archetype", "twin", "half", "seed", "disposition", "lapsed",
           "premature", "gap", "label", "calls", "end_t", "picture")
NO_CALLS = ("this folder was graded before the grader recorded each episode's calls: its record "
            "is shown, but not its calls nor its picture (grade it again into a new folder to "
            "see them)")


SUMMARY = "summary.json"
TRANSCRIPTS = "transcripts"
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
    summary: dict | None = None  # its summary.json, where it has one
    figures: tuple = ()          # (file name, PNG bytes) of its own figures
    conversations: dict = field(default_factory=dict)  # transcript name -> its page's JSON

    @property
    def private(self) -> bool:
        return self.manifest.get("split") == PRIVATE

    @property
    def self_reported(self) -> bool:
        """An imported log's run (`eval import-inspect`): its run.json, or its summary, says
        so."""
        return (self.manifest.get("self_reported") is True
                or (self.summary or {}).get("self_reported") is True)


# ------------------------------------------------------------------ reading, following no link
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a fifo"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"),
          (stat.S_ISREG, "a regular file"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _refused(path: Path, mode: int, wanted: str = "a regular file or folder") -> ValueError:
    return ValueError(f"{path} is {_kind(mode)}, not {wanted}: `eval view` reads only regular "
                      "files and folders under each DIR and follows no link (a link would "
                      "publish whatever it points to); remove it, or copy what it points to in")


@dataclass
class _Listing:
    """One folder under a DIR: its regular files and its subfolders, by name."""

    files: set
    dirs: set
    ident: tuple  # (st_dev, st_ino): the same run reached from two DIRs is shown once


class _Input:
    """One DIR of the command line, walked and read through file descriptors: every folder is
    opened with `O_NOFOLLOW | O_DIRECTORY` relative to its parent's descriptor, every file with
    `O_NOFOLLOW` after an `lstat` that says it is regular (and an `fstat` that says it is still
    the same file), so no component of any path below DIR can be a link, and nothing but a
    regular file is ever opened. DIR itself must not be a link either; the folders above it are
    the operator's own path, taken as they are."""

    def __init__(self, top: Path):
        self.top = top
        try:
            self.fd = os.open(top, _DIR)
        except OSError:
            try:
                mode = os.lstat(top).st_mode
            except OSError:
                raise ValueError(f"{top} is not a folder") from None
            raise (ValueError(f"{top} is not a folder") if stat.S_ISREG(mode) else
                   _refused(top, mode, "a folder")) from None
        self.listing: dict[tuple[str, ...], _Listing] = {}

    def close(self) -> None:
        os.close(self.fd)

    def path(self, rel: tuple[str, ...]) -> Path:
        return self.top.joinpath(*rel)

    def _why(self, dir_fd: int, name: str, rel: tuple[str, ...], exc: OSError,
             wanted: str) -> ValueError:
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            return ValueError(f"{self.path(rel)} cannot be read ({exc.strerror})")
        return _refused(self.path(rel), mode, wanted)

    def _open_dir(self, dir_fd: int, name: str, rel: tuple[str, ...]) -> int:
        try:
            return os.open(name, _DIR, dir_fd=dir_fd)
        except OSError as exc:
            raise self._why(dir_fd, name, rel, exc, "a folder") from None

    def walk(self) -> dict[tuple[str, ...], _Listing]:
        """Every folder under DIR (by its parts), with its files and subfolders; a link or any
        other entry that is neither a regular file nor a folder is refused, naming it."""
        def visit(fd: int, rel: tuple[str, ...]) -> None:
            files, dirs = set(), set()
            try:
                with os.scandir(fd) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            dirs.add(entry.name)
                        elif entry.is_file(follow_symlinks=False):
                            files.add(entry.name)
                        else:
                            raise _refused(self.path(rel + (entry.name,)),
                                           entry.stat(follow_symlinks=False).st_mode)
            except OSError as exc:
                raise ValueError(f"{self.path(rel)} cannot be listed ({exc.strerror})") from None
            st = os.fstat(fd)
            self.listing[rel] = _Listing(files, dirs, (st.st_dev, st.st_ino))
            for name in sorted(dirs):
                child = self._open_dir(fd, name, rel + (name,))
                try:
                    visit(child, rel + (name,))
                finally:
                    os.close(child)

        visit(self.fd, ())
        return self.listing

    def read(self, rel: tuple[str, ...]) -> bytes:
        """The bytes of the regular file at `rel` (parts below DIR), no link followed."""
        opened: list[int] = []
        try:
            fd = self.fd
            for i, name in enumerate(rel[:-1]):
                fd = self._open_dir(fd, name, rel[:i + 1])
                opened.append(fd)
            name = rel[-1]
            try:
                before = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if not stat.S_ISREG(before.st_mode):
                    raise _refused(self.path(rel), before.st_mode, "a regular file")
                handle = os.open(name, _FILE, dir_fd=fd)
            except OSError as exc:
                raise self._why(fd, name, rel, exc, "a regular file") from None
            with open(handle, "rb") as file:
                now = os.fstat(file.fileno())
                if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (
                        before.st_dev, before.st_ino):
                    raise ValueError(f"{self.path(rel)} was replaced while it was read")
                return file.read()
        finally:
            for fd in opened:
                os.close(fd)


def _json(data: bytes, path: Path) -> object:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is corrupt ({exc})") from None


def _rows(data: bytes, path: Path) -> list[dict]:
    """The complete, verified rows of an episodes file's bytes (`runfolder.read_rows`, but of
    bytes read without following a link): a torn last line is left out."""
    rows = []
    for number, line in enumerate(data[:data.rfind(b"\n") + 1].splitlines(), 1):
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}:{number} is not a JSON record ({exc}); the file is "
                             "corrupt: move it away to start the run afresh") from None
        row = _verified(row, path, number)
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path}:{number} is not a graded episode (it has no "
                             f"{', '.join(missing)})")
        rows.append(row)
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


def _transcript(data: bytes, path: Path) -> list[dict]:
    """A transcript's complete lines (`model_arm.read_transcript`, of bytes read without
    following a link)."""
    lines = []
    for number, line in enumerate(data[:data.rfind(b"\n") + 1].splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}:{number} is not a transcript line ({exc})") from None
    return lines


def _read_run(tree: _Input, rel: tuple[str, ...], name: str) -> Folder:
    """One run folder, read whole and checked: run.json, its rows (checksums, split), its
    summary, its figures and its model episodes' transcripts."""
    path, here = tree.path(rel), tree.listing[rel]
    manifest = _json(tree.read(rel + (MANIFEST,)), path / MANIFEST)
    if not isinstance(manifest, dict):
        raise ValueError(f"{path / MANIFEST} is corrupt (not a JSON object)")
    rows = _rows(tree.read(rel + (ROWS,)), path / ROWS)
    _check_split(path, manifest, rows)
    summary = None
    if SUMMARY in here.files:
        summary = _json(tree.read(rel + (SUMMARY,)), path / SUMMARY)
        if not isinstance(summary, dict) or not isinstance(summary.get("policies"), dict):
            summary = None
        elif manifest["split"] != PRIVATE and any(
                k in summary and summary[k] != manifest[k] for k in ("split", "fingerprint")):
            # figures of another split's run, which the index would show as this split's
            raise ValueError(f"{path / SUMMARY} is a summary of split {summary.get('split')} "
                             f"(fingerprint {summary.get('fingerprint')}), not of the run "
                             f"{MANIFEST} names ({manifest['split']}, "
                             f"{manifest['fingerprint']}); refused")
    figures = []
    for file in sorted(f for f in here.files if f.endswith(".png")):
        data = tree.read(rel + (file,))
        if not data.startswith(PNG):
            raise ValueError(f"{path / file} is not a PNG picture; the site would publish it "
                             "as a figure: remove or rename it")
        figures.append((file, data))
    conversations = {}
    held = tree.listing.get(rel + (TRANSCRIPTS,))
    for row in rows:
        source = f"{row['task_id']}__seed{row['seed']}.jsonl"
        if (row["policy"].startswith("model:") and held is not None and source in held.files
                and source not in conversations):
            where = rel + (TRANSCRIPTS, source)
            conversations[source] = json.dumps(
                _conversation(_transcript(tree.read(where), tree.path(where))),
                separators=(",", ":"))
    return Folder(name, path, manifest, rows, summary, tuple(figures), conversations)


def discover(dirs: list[Path]) -> list[Folder]:
    """Every graded run under each of `dirs`, in path order, read whole and checked; a DIR that
    holds none, a link or anything else not a regular file or folder under it, a row that fails
    its checksum or is not of its run's split, is an error that names it (and nothing is
    written)."""
    found: dict[tuple, Folder] = {}
    for top in dirs:
        tree = _Input(top)
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


def _file_name(text: str) -> str:
    """A task id or policy as a file name: letters, digits, `-`, `_` and `.` only."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or "_"


class _World:
    """How a folder's episodes were played, to rebuild them (None on the private split, whose
    tasks need its master seed)."""

    def __init__(self, manifest: dict):
        self.split = manifest.get("split", "public")
        self.private = self.split == PRIVATE
        self.corpus = None if self.private else load_corpus(self.split)
        faults = manifest.get("faults")
        self.faults = None if faults is None else FaultProfile(faults["intensity"],
                                                               frozenset(faults["families"]))
        costs = manifest.get("costs")
        self.costs = None if costs is None else Costs(**costs)
        self.probe = manifest.get("probe", "full")

    def episode(self, row: dict):
        return replay(self.corpus.task(row["task_id"]), row["seed"], row["calls"],
                      row["lapsed"], faults=self.faults, probe=self.probe, costs=self.costs)


def _replayed(world: _World, row: dict) -> tuple[list | None, str]:
    """The row's calls with their results, rebuilt by the engine, and whether the rebuilt
    record is the graded one."""
    if "calls" not in row:
        return None, NO_CALLS
    if world.private:
        return None, "the private split's episodes are not rebuilt: its tasks need its master seed"
    try:
        episode = world.episode(row)
    except (ValueError, KeyError) as exc:
        return None, f"the recorded calls do not replay: {exc}"
    record = episode.record().to_dict()
    differ = [k for k in record if record[k] != row.get(k)]
    calls = [[t, tool, args, {k: v for k, v in result.items() if k not in ("tool", "t")}]
             for t, tool, args, result in episode.history]
    if differ:
        return calls, f"the calls replay, but to another record ({', '.join(differ)} differ)"
    return calls, "ok"


def _twins(rows: list[dict]) -> dict[tuple[str, str], str]:
    """(twin id, half) -> task id, for the twin pairs among the rows."""
    return {(r["twin_id"], r["twin_half"]): r["task_id"] for r in rows if r["twin_id"]}


def _summary(folder: Folder) -> dict | None:
    if folder.summary is not None:
        return folder.summary
    if folder.private or not folder.rows:
        return None
    policies = list(dict.fromkeys(r["policy"] for r in folder.rows))
    return summarize(folder.rows, folder.manifest["split"], policies,
                     sorted({r["seed"] for r in folder.rows}))


def _to_pick(folder: Folder, pictures: str, worst: int) -> set[int]:
    """Indexes of the rows to draw at build time."""
    if pictures == "none":
        return set()
    drawable = [i for i, r in enumerate(folder.rows) if "calls" in r]
    if pictures == "all":
        return set(drawable)
    by_policy: dict[str, list[int]] = defaultdict(list)
    for i in drawable:
        by_policy[folder.rows[i]["policy"]].append(i)
    chosen = {i for i in drawable if folder.rows[i]["policy"].startswith("model:")}
    for indexes in by_policy.values():
        chosen.update(sorted(indexes, key=lambda i: -folder.rows[i]["gap"])[:worst])
    return chosen


def _conversation(transcript: list[dict]) -> dict:
    """A model episode's transcript (its lines) as the page shows it: the messages in order,
    each marked (`system`, `brief`, `assistant`, `result`, `invalid`, `not_executed`,
    `reminder`), with each request's tokens, latency and retries."""
    turns = []
    for line in transcript:
        messages = []
        for m in line.get("new_messages", []):
            kind = m.get("role", "?")
            if kind == "assistant":  # the previous reply, sent back: shown once, as the reply
                continue
            content = m.get("content")
            if kind == "user":
                kind = "reminder" if content == REMINDER else "brief"
            elif kind == "tool":
                text = content if isinstance(content, str) else json.dumps(content)
                kind = ("invalid" if '"invalid call:' in text else
                        "not_executed" if '"not executed:' in text else "result")
            messages.append({**m, "kind": kind})
        choices = (line.get("response") or {}).get("choices") or [{}]
        turns.append({"turn": line.get("turn"), "messages": messages,
                      "reply": choices[0].get("message"),
                      "finish": choices[0].get("finish_reason"),
                      "usage": line.get("usage"), "latency_s": line.get("latency_s"),
                      "attempts": line.get("attempts"), "errors": line.get("errors", []),
                      "params": line.get("params")})
    return {"turns": turns}


class _Writer:
    """Writes the site's files and counts them."""

    def __init__(self, out: Path):
        self.out, self.files, self.bytes = out, 0, 0

    def data(self, rel: str, key: str, value) -> None:
        self.encoded(rel, key, json.dumps(value, separators=(',', ':')))

    def encoded(self, rel: str, key: str, value: str) -> None:
        """A data file of a value already encoded as JSON."""
        self.text(rel, f"FG.put({json.dumps(key)},{value});\n")

    def raw(self, rel: str, data: bytes) -> None:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.files += 1
        self.bytes += len(data)

    def text(self, rel: str, text: str) -> None:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        self.files += 1
        self.bytes += len(text.encode())

    def copy(self, source: Path, rel: str) -> None:
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, path)
        self.files += 1
        self.bytes += path.stat().st_size


def _page(name: str) -> str:
    title = html.escape(PAGES[name])
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{title} · finality-gym</title>\n"
            f'<link rel="stylesheet" href="assets/style.css">\n'
            f'<script src="assets/app.js"></script>\n<script src="data/site.js"></script>\n'
            f'</head><body data-page="{name}"><header><a href="index.html">finality-gym '
            f'results</a> <a href="episodes.html">episodes</a> <a href="compare.html">side by '
            f'side</a></header>\n<main id="app"><p class="loading">loading...</p></main>\n'
            f"<script>FG.start();</script>\n</body></html>\n")


def _check_out(out: Path) -> None:
    """`out` may be a new folder, an empty one or an earlier site (to be replaced); anything
    else is refused."""
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise ValueError(f"--out {out} is a symbolic link; give the folder itself")
    if not stat.S_ISDIR(mode):
        raise ValueError(f"--out {out} is a file")
    if any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(f"--out {out} is a folder that holds something other than a site "
                         "this command built; give an empty or new folder")


def _stage(out: Path) -> tuple[Path, list[Path]]:
    """A new, empty folder beside `out` to build the site in, and the folders above it that
    were made for it (removed again if the build fails)."""
    made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = out.parent / f".{out.name}.building-{os.getpid()}-{secrets.token_hex(4)}"
        staging.mkdir()
    except OSError as exc:
        raise ValueError(f"--out {out} cannot be written ({exc.strerror})") from None
    return staging, made


def _replace(staging: Path, out: Path) -> None:
    """The built site at `out`, in place of what was there (an earlier site, an empty folder);
    until the last rename `out` is what it was."""
    _check_out(out)  # again: something may have been put there while the site was built
    old = None
    if os.path.lexists(out):
        old = out.parent / f".{out.name}.replaced-{os.getpid()}-{secrets.token_hex(4)}"
        os.rename(out, old)
    try:
        os.rename(staging, out)
    except OSError:
        if old is not None:
            os.rename(old, out)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def build(dirs: list[Path], out: Path = DEFAULT_OUT, pictures: str = "some", workers: int = 2,
          worst: int = WORST, progress: bool = False, private: bool = False) -> dict:
    """Build the site of every graded run under `dirs` into `out`, the pictures drawn by
    `workers` processes (`worst`: how many of each policy `some` draws); return what was written
    (`folders`, `episodes`, `pictures`, `files`, `bytes`, `seconds`, and `lazy`: the pictures
    not drawn, by path, for `serve` to draw on request). Every input is read and checked before
    anything is written, and the site is built beside `out` and replaces it only once whole: a
    failure leaves `out` as it was."""
    started = time.perf_counter()
    if pictures not in PICTURES:
        raise ValueError(f"--pictures must be one of {', '.join(PICTURES)}, got {pictures!r}")
    if not 1 <= workers <= 64:
        raise ValueError(f"--workers must lie in 1..64, got {workers}")
    folders = discover(dirs)  # everything read and checked before anything is written
    hidden = [f.name for f in folders if f.private]
    if hidden and not private:
        raise ValueError(f"{hidden[0]} is a run of the private split: its site would publish "
                         "the hidden tasks' ids, records and calls; pass --private to build it "
                         "anyway, for the operator's eyes only")
    if out.resolve() in [f.path.resolve() for f in folders] or any(
            out.resolve() in f.path.resolve().parents for f in folders):
        raise ValueError(f"--out {out} would overwrite a results folder it reads")
    _check_out(out)
    staging, made = _stage(out)
    try:
        built = _write(folders, dirs, staging, pictures, workers, worst, progress)
        _replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for folder in made:  # the folders made for the staging one, innermost first
            try:
                folder.rmdir()
            except OSError:
                break
        raise
    return {**built, "seconds": time.perf_counter() - started}


def _write(folders: list[Folder], dirs: list[Path], out: Path, pictures: str, workers: int,
           worst: int, progress: bool) -> dict:
    """Write the site of `folders` (read and checked) into the empty folder `out`."""
    (out / MARKER).write_text("built by `python -m eval view`; replaced by the next build\n")
    w = _Writer(out)
    for name in ("app.js", "style.css"):
        w.copy(ASSETS / name, f"assets/{name}")
    for name in PAGES:
        w.text(f"{name}.html", _page(name))
    site: dict = {"folders": [], "built_with": "python -m eval view " + " ".join(
        str(d) for d in dirs)}
    lazy: dict[str, tuple] = {}
    jobs: list[tuple] = []
    episodes = 0
    for f_id, folder in enumerate(folders):
        world = _World(folder.manifest)
        policies = list(dict.fromkeys(r["policy"] for r in folder.rows))
        p_of = {p: i for i, p in enumerate(policies)}
        summary = _summary(folder)
        twins = _twins(folder.rows)
        draw_now = _to_pick(folder, pictures, worst)
        rows_out, by_task, first = [], defaultdict(list), {}
        for i, row in enumerate(folder.rows):
            p = p_of[row["policy"]]
            picture = None
            if "calls" in row and not world.private:
                picture = (f"pictures/{f_id}/{p}/{_file_name(row['task_id'])}__s{row['seed']}"
                           ".png")
                if i in draw_now:
                    jobs.append((folder.manifest, row, out / picture))
                else:
                    lazy[picture] = (world, row)
            calls, replayed = _replayed(world, row)
            conversation = None
            source = f"{row['task_id']}__seed{row['seed']}.jsonl"
            if row["policy"].startswith("model:") and source in folder.conversations:
                conversation = (f"data/{f_id}/conv/{_file_name(row['task_id'])}__s"
                                f"{row['seed']}.js")
                w.encoded(conversation, f"conv/{f_id}/{row['task_id']}/{row['seed']}",
                          folder.conversations[source])
            rows_out.append([p, row["task_id"], row["archetype"], row["twin_id"],
                             row["twin_half"], row["seed"], row["disposition"],
                             int(row["lapsed"]), int(row["premature"]), row["gap"],
                             row["label"], row["calls_used"], row["end_t"],
                             int(i in draw_now)])
            first.setdefault(row["task_id"], row)
            by_task[row["task_id"]].append({
                "p": p, "seed": row["seed"], **{k: row[k] for k in RECORD if k in row},
                **{k: row[k] for k in MODEL_FIELDS if k in row},
                "calls": calls, "replayed": replayed, "picture": picture,
                "conversation": conversation})
        for task_id, eps in by_task.items():
            one = first[task_id]
            twin = None
            if one["twin_id"]:
                other = "fail" if one["twin_half"] == "settle" else "settle"
                twin = twins.get((one["twin_id"], other))
            w.data(f"data/{f_id}/tasks/{_file_name(task_id)}.js", f"task/{f_id}/{task_id}",
                   {"task": task_id, "archetype": one["archetype"], "twin_id": one["twin_id"],
                    "twin_half": one["twin_half"], "twin_task": twin, "episodes": eps})
        w.data(f"data/{f_id}/rows.js", f"rows/{f_id}", {"columns": COLUMNS, "rows": rows_out})
        figures = []
        for name, data in folder.figures:
            w.raw(f"figures/{f_id}/{name}", data)
            figures.append(f"figures/{f_id}/{name}")
        episodes += len(folder.rows)
        site["folders"].append({
            "id": f_id, "name": folder.name, "path": str(folder.path),
            "split": folder.manifest.get("split"), "fingerprint": folder.manifest.get(
                "fingerprint"), "probe": folder.manifest.get("probe"),
            "seeds": folder.manifest.get("seeds"), "faults": folder.manifest.get("faults"),
            "costs": folder.manifest.get("costs"), "sandbox": folder.manifest.get("sandbox"),
            "model": (summary or {}).get("model") or folder.manifest.get("model"),
            "self_reported": folder.self_reported,
            "development": folder.manifest.get("split") in SPLITS,
            "drawn": len(draw_now),
            "episodes": len(folder.rows), "policies": policies,
            "summary": None if summary is None else {
                "policies": summary["policies"], "model_arm": summary.get("model_arm"),
                "bootstrap": summary.get("bootstrap"), "rankings": summary.get("rankings")},
            "tasks": sorted(by_task), "with_calls": sum("calls" in r for r in folder.rows),
            "figures": figures})
        if progress:
            print(f"  {folder.name}: {len(folder.rows):,} episodes, {len(policies)} policies",
                  flush=True)
    priced = [(f["name"], f["summary"]) for f in site["folders"] if _priced(f["summary"])]
    if priced:
        from .model_arm import cost_figure
        (out / "figures").mkdir(exist_ok=True)
        cost_figure(priced, out / "figures" / "models_cost.png")
        site["cost_figure"] = "figures/models_cost.png"
        w.files += 1
        w.bytes += (out / "figures" / "models_cost.png").stat().st_size
    w.data("data/site.js", "site", site)
    _draw_all(jobs, workers)
    w.files += len(jobs)
    w.bytes += sum(path.stat().st_size for _, _, path in jobs)
    return {"folders": len(folders), "episodes": episodes, "pictures": len(jobs), "files": w.files,
            "bytes": w.bytes, "lazy": lazy}


def _priced(summary: dict | None) -> bool:
    """A model run given prices (`--price-in`, `--price-out`): it has a cost per episode."""
    arm = (summary or {}).get("model_arm") or {}
    return any(name.startswith("model:") and figures.get("cost_per_episode_usd", 0) > 0
               for name, figures in arm.items())


_DRAWING = threading.Lock()  # matplotlib's Agg is not to be used by two threads at once


_WORLDS: dict[str, _World] = {}


def _draw_job(job: tuple) -> None:
    manifest, row, path = job
    key = json.dumps(manifest, sort_keys=True)
    if key not in _WORLDS:
        _WORLDS[key] = _World(manifest)
    _draw(_WORLDS[key], row, path)


def _draw_all(jobs: list[tuple], workers: int) -> None:
    """Draw the pictures chosen at build time, in `workers` processes (a picture takes ~0.8 s
    of matplotlib)."""
    if workers == 1 or len(jobs) < 2:
        for job in jobs:
            _draw_job(job)
        return
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with context.Pool(min(workers, len(jobs))) as pool:
        for _ in pool.imap_unordered(_draw_job, jobs, chunksize=4):
            pass


def _draw(world: _World, row: dict, path: Path) -> None:
    from finality_gym.timeline import draw
    from .show import save_png
    episode = world.episode(row)
    with _DRAWING:
        save_png(draw(episode), path)


class _Handler(SimpleHTTPRequestHandler):
    """The site's files, to the page `serve` printed only: a request must name the run's token
    as the first part of its path and a `Host` of this server's own (`127.0.0.1:PORT`,
    `localhost:PORT`); no folder is listed."""

    token = ""
    lazy: dict = {}
    site = Path()

    def _admit(self) -> bool:
        port = self.server.server_address[1]
        host = (self.headers.get("Host") or "").strip().lower()
        if host not in (f"127.0.0.1:{port}", f"localhost:{port}"):
            # another name for this address: a page of another site after DNS rebinding
            self.send_error(HTTPStatus.MISDIRECTED_REQUEST,
                            "this server answers only to 127.0.0.1 and localhost")
            return False
        path = self.path.split("?", 1)[0].split("#", 1)[0]
        prefix = f"/{self.token}/"
        if not hmac.compare_digest(path[:len(prefix)].encode(), prefix.encode()):
            self.send_error(HTTPStatus.NOT_FOUND)
            return False
        self.path = "/" + path[len(prefix):]
        return True

    def do_GET(self) -> None:
        if not self._admit():
            return
        rel = self.path.lstrip("/")
        if rel in self.lazy and not (self.site / rel).exists():
            try:
                _draw(*self.lazy[rel], self.site / rel)
            except ValueError as exc:
                self.send_error(500, f"the episode does not replay: {exc}")
                return
        super().do_GET()

    def do_HEAD(self) -> None:
        if self._admit():
            super().do_HEAD()

    def list_directory(self, path):
        self.send_error(HTTPStatus.NOT_FOUND)
        return None

    def end_headers(self) -> None:
        # no other origin may load a file (a script tag of another page), nor the token leak
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format: str, *args) -> None:
        pass


def serve(site: Path, port: int, lazy: dict, private: bool = False) -> None:
    """Serve `site` on 127.0.0.1 until interrupted, drawing a picture not yet drawn on its
    first request, to whoever holds the address it prints: its path starts with a token drawn
    for this run, and any request without it (another web page the operator visits, which
    cannot know it) is answered 404, any for another host name 421."""
    handler = type("Handler", (_Handler,), {"token": secrets.token_urlsafe(24), "lazy": lazy,
                                            "site": site})
    server = ThreadingHTTPServer(("127.0.0.1", port), partial(handler, directory=str(site)))
    print(f"serving {site} at http://127.0.0.1:{server.server_address[1]}/{handler.token}/"
          "index.html (Ctrl-C to stop; the address holds a token made for this run: without "
          "it a request is refused)", flush=True)
    if private:
        print("the site holds runs of the private split: whoever has this address can read "
              "them; do not share it", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR",
                        help="results folders (each graded run under them is shown)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"the site's folder (default {DEFAULT_OUT}; an earlier site there "
                             "is replaced, any other content refused)")
    parser.add_argument("--pictures", choices=PICTURES, default="some",
                        help="timeline pictures drawn now: every model episode and the "
                             f"{WORST} worst of each policy (some), every episode (all: ~0.8 s "
                             "and ~140 KB each), or none; --serve draws the others on request")
    parser.add_argument("--workers", type=int, default=2, help="processes drawing pictures")
    parser.add_argument("--private", action="store_true",
                        help="include runs of the private split (refused by default: a site "
                             "is made to be published); with --serve, only the printed "
                             "address, which holds a token, reaches them")
    parser.add_argument("--serve", action="store_true",
                        help="serve the site on 127.0.0.1, at an address that holds a token "
                             "made for the run (a request without it is refused)")
    parser.add_argument("--port", type=int, default=8000, help="with --serve (0: any free port)")
    parser.set_defaults(no_progress=True)


def main(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must lie in 0..65535, got {args.port}")
    built = build(args.dirs, args.out, args.pictures, args.workers, progress=True,
                  private=args.private)
    print(f"wrote {args.out}/index.html: {built['folders']} folders, {built['episodes']:,} "
          f"episodes, {built['pictures']} pictures, {built['bytes'] / 1e6:.1f} MB in "
          f"{built['seconds']:.1f} s")
    if args.serve:
        serve(args.out, args.port, built["lazy"], private=args.private)
    return 0
