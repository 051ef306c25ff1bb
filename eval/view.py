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
"""

from __future__ import annotations

import argparse
import html
import json
import multiprocessing
import re
import shutil
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from agents.model import REMINDER
from finality_gym import load_corpus
from finality_gym.corpus import PRIVATE
from finality_gym.economics import Costs
from finality_gym.episode import replay
from finality_gym.faults import FaultProfile

from .runfolder import MANIFEST, ROWS, read_rows
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


@dataclass(frozen=True)
class Folder:
    """One graded run of the site: where it is, what it pinned, its rows."""

    name: str
    path: Path
    manifest: dict
    rows: list


def discover(dirs: list[Path]) -> list[Folder]:
    """Every graded run under each of `dirs`, in path order; a DIR that holds none, or a row
    that fails its checksum, is an error that names it (and nothing is written)."""
    found: dict[Path, Folder] = {}
    for top in dirs:
        if not top.is_dir():
            raise ValueError(f"{top} is not a folder")
        runs = sorted(p.parent for p in top.rglob(ROWS) if (p.parent / MANIFEST).is_file())
        if not runs:
            raise ValueError(f"{top} holds no graded run (a folder with {ROWS} and {MANIFEST})")
        for path in runs:
            real = path.resolve()
            if real in found:
                continue
            try:
                manifest = json.loads((path / MANIFEST).read_text())
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path / MANIFEST} is corrupt ({exc})") from None
            name = (Path(top.resolve().name) / path.resolve().relative_to(top.resolve())).as_posix()
            found[real] = Folder(name.rstrip("/.") or top.name, path, manifest,
                                 read_rows(path / ROWS))
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
    path = folder.path / "summary.json"
    if path.is_file():
        summary = json.loads(path.read_text())
        if isinstance(summary.get("policies"), dict):
            return summary
    if folder.manifest.get("split") == PRIVATE or not folder.rows:
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


def _conversation(path: Path) -> dict:
    """A model episode's transcript as the page shows it: the messages in order, each marked
    (`system`, `brief`, `assistant`, `result`, `invalid`, `not_executed`, `reminder`), with
    each request's tokens, latency and retries."""
    from .model_arm import read_transcript
    turns = []
    for line in read_transcript(path):
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
        text = f"FG.put({json.dumps(key)},{json.dumps(value, separators=(',', ':'))});\n"
        self.text(rel, text)

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


def _clear(out: Path) -> None:
    """An empty `out`: a new folder, or an earlier site (replaced); anything else is refused."""
    if out.exists():
        if not out.is_dir():
            raise ValueError(f"--out {out} is a file")
        if any(out.iterdir()) and not (out / MARKER).exists():
            raise ValueError(f"--out {out} is a folder that holds something other than a site "
                             "this command built; give an empty or new folder")
        shutil.rmtree(out)
    out.mkdir(parents=True)


def build(dirs: list[Path], out: Path = DEFAULT_OUT, pictures: str = "some", workers: int = 2,
          worst: int = WORST, progress: bool = False, private: bool = False) -> dict:
    """Build the site of every graded run under `dirs` into `out`, the pictures drawn by
    `workers` processes (`worst`: how many of each policy `some` draws); return what was written
    (`folders`, `episodes`, `pictures`, `files`, `bytes`, `seconds`, and `lazy`: the pictures
    not drawn, by path, for `serve` to draw on request)."""
    started = time.perf_counter()
    if pictures not in PICTURES:
        raise ValueError(f"--pictures must be one of {', '.join(PICTURES)}, got {pictures!r}")
    if not 1 <= workers <= 64:
        raise ValueError(f"--workers must lie in 1..64, got {workers}")
    folders = discover(dirs)  # everything read and checked before anything is written
    hidden = [f.name for f in folders if f.manifest.get("split") == PRIVATE]
    if hidden and not private:
        raise ValueError(f"{hidden[0]} is a run of the private split: its site would publish "
                         "the hidden tasks' ids, records and calls; pass --private to build it "
                         "anyway, for the operator's eyes only")
    if out.resolve() in [f.path.resolve() for f in folders] or any(
            out.resolve() in f.path.resolve().parents for f in folders):
        raise ValueError(f"--out {out} would overwrite a results folder it reads")
    _clear(out)
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
        transcripts = folder.path / "transcripts"
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
            if row["policy"].startswith("model:"):
                source = transcripts / f"{row['task_id']}__seed{row['seed']}.jsonl"
                if source.is_file():
                    conversation = (f"data/{f_id}/conv/{_file_name(row['task_id'])}__s"
                                    f"{row['seed']}.js")
                    w.data(conversation, f"conv/{f_id}/{row['task_id']}/{row['seed']}",
                           _conversation(source))
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
        for png in sorted(folder.path.glob("*.png")):
            w.copy(png, f"figures/{f_id}/{png.name}")
            figures.append(f"figures/{f_id}/{png.name}")
        episodes += len(folder.rows)
        site["folders"].append({
            "id": f_id, "name": folder.name, "path": str(folder.path),
            "split": folder.manifest.get("split"), "fingerprint": folder.manifest.get(
                "fingerprint"), "probe": folder.manifest.get("probe"),
            "seeds": folder.manifest.get("seeds"), "faults": folder.manifest.get("faults"),
            "costs": folder.manifest.get("costs"), "sandbox": folder.manifest.get("sandbox"),
            "model": (summary or {}).get("model") or folder.manifest.get("model"),
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
            "bytes": w.bytes, "seconds": time.perf_counter() - started, "lazy": lazy}


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


def serve(site: Path, port: int, lazy: dict) -> None:
    """Serve `site` on 127.0.0.1 until interrupted, drawing a picture not yet drawn on its
    first request."""

    class Handler(SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            rel = self.path.split("?", 1)[0].split("#", 1)[0].lstrip("/")
            if rel in lazy and not (site / rel).exists():
                try:
                    _draw(*lazy[rel], site / rel)
                except ValueError as exc:
                    self.send_error(500, f"the episode does not replay: {exc}")
                    return
            super().do_GET()

        def log_message(self, format: str, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), partial(Handler, directory=str(site)))
    print(f"serving {site} at http://127.0.0.1:{server.server_address[1]}/index.html "
          "(Ctrl-C to stop)", flush=True)
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
                             "is made to be published)")
    parser.add_argument("--serve", action="store_true", help="serve the site on 127.0.0.1")
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
        serve(args.out, args.port, built["lazy"])
    return 0
