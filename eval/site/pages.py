"""The site's files (`write_site`): its four pages, the script and style sheet they share, the
data they load as scripts (`FG.put(KEY, JSON);`), the runs' own figures and the timeline
pictures. The data is cut by page, so that each loads only what it shows (eval/site/view.py says
why): `data/site.js` (the runs and their summaries: the index), `data/F/rows.js` (a run's
compact rows: the episodes table), `data/F/tasks/TASK.js` (a task's episodes under every
policy: an episode page) and `data/F/conv/TASK__sSEED.js` (a model episode's conversation)."""

from __future__ import annotations

import html
import json
import re
import shutil
from collections import defaultdict
from pathlib import Path

from agents.sandbox.self_test import describe
from finality_gym.corpus import SPLITS

from eval.grading.runfolder import transcript_name
from eval.site.pictures import draw_all, pick
from eval.site.replays import replayed
from eval.site.runs import Folder
from eval.stats.summary import summarize

ASSETS = Path(__file__).parent
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
COST_FIGURE = "figures/models_cost.png"


class _Writer:
    """Writes the site's files and counts them; the timeline pictures it is given are drawn at
    the end (`draw`), all at once in worker processes, or left for `serve` (`lazy`)."""

    def __init__(self, out: Path):
        self.out, self.files, self.bytes = out, 0, 0
        self.jobs: list[tuple] = []  # (run.json, row, path) of each picture drawn now
        self.lazy: dict[str, tuple] = {}  # path -> (world, row) of each picture left for later

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
        self.count(path)

    def count(self, path: Path) -> None:
        """A file written by someone else (a figure, a picture)."""
        self.files += 1
        self.bytes += path.stat().st_size

    def picture(self, rel: str, folder: Folder, row: dict, now: bool) -> None:
        if now:
            self.jobs.append((folder.manifest, row, self.out / rel))
        else:
            self.lazy[rel] = (folder.world, row)

    def draw(self, workers: int) -> None:
        draw_all(self.jobs, workers)
        for _, _, path in self.jobs:
            self.count(path)


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


def _file_name(text: str) -> str:
    """A task id or policy as a file name: letters, digits, `-`, `_` and `.` only."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".") or "_"


def _twins(rows: list[dict]) -> dict[tuple[str, str], str]:
    """(twin id, half) -> task id, for the twin pairs among the rows."""
    return {(r["twin_id"], r["twin_half"]): r["task_id"] for r in rows if r["twin_id"]}


def _summary(folder: Folder) -> dict | None:
    """The run's summary.json, or one computed from its rows where it has none."""
    if folder.summary is not None:
        return folder.summary
    if folder.private or not folder.rows:
        return None
    policies = list(dict.fromkeys(r["policy"] for r in folder.rows))
    return summarize(folder.rows, folder.world.corpus, policies,
                     sorted({r["seed"] for r in folder.rows}))


def _priced(summary: dict | None) -> bool:
    """A model run given prices (`--price-in`, `--price-out`): it has a cost per episode."""
    arm = (summary or {}).get("model_arm") or {}
    return any(name.startswith("model:") and figures.get("cost_per_episode_usd", 0) > 0
               for name, figures in arm.items())


def _episode(w: _Writer, f_id: int, folder: Folder, p: int, row: dict, draw_now: bool) -> dict:
    """One episode as its page shows it (its record, its calls rebuilt, its picture and its
    conversation, each written where it has one)."""
    picture = None
    if "calls" in row and not folder.private:
        picture = f"pictures/{f_id}/{p}/{_file_name(row['task_id'])}__s{row['seed']}.png"
        w.picture(picture, folder, row, draw_now)
    calls, replay = replayed(folder.world, row)
    conversation = None
    source = transcript_name(row["task_id"], row["seed"])
    if row["policy"].startswith("model:") and source in folder.conversations:
        conversation = f"data/{f_id}/conv/{_file_name(row['task_id'])}__s{row['seed']}.js"
        w.encoded(conversation, f"conv/{f_id}/{row['task_id']}/{row['seed']}",
                  folder.conversations[source])
    return {"p": p, "seed": row["seed"], **{k: row[k] for k in RECORD if k in row},
            **{k: row[k] for k in MODEL_FIELDS if k in row},
            "calls": calls, "replayed": replay, "picture": picture,
            "conversation": conversation}


def _write_tasks(w: _Writer, f_id: int, folder: Folder, by_task: dict[str, list]) -> None:
    """One file per task of the run: the task, the other half of its twin pair, and its
    episodes under every policy."""
    first: dict[str, dict] = {}
    for row in folder.rows:
        first.setdefault(row["task_id"], row)
    twins = _twins(folder.rows)
    for task_id, eps in by_task.items():
        one = first[task_id]
        twin = None
        if one["twin_id"]:
            other = "fail" if one["twin_half"] == "settle" else "settle"
            twin = twins.get((one["twin_id"], other))
        w.data(f"data/{f_id}/tasks/{_file_name(task_id)}.js", f"task/{f_id}/{task_id}",
               {"task": task_id, "archetype": one["archetype"], "twin_id": one["twin_id"],
                "twin_half": one["twin_half"], "twin_task": twin, "episodes": eps})


def _write_folder(w: _Writer, f_id: int, folder: Folder, draw_now: set[int]) -> dict:
    """The run's files (its rows, its tasks' files, its figures); return its entry of
    `data/site.js`."""
    policies = list(dict.fromkeys(r["policy"] for r in folder.rows))
    p_of = {p: i for i, p in enumerate(policies)}
    rows_out, by_task = [], defaultdict(list)
    for i, row in enumerate(folder.rows):
        p = p_of[row["policy"]]
        rows_out.append([p, row["task_id"], row["archetype"], row["twin_id"],
                         row["twin_half"], row["seed"], row["disposition"],
                         int(row["lapsed"]), int(row["premature"]), row["gap"],
                         row["label"], row["calls_used"], row["end_t"], int(i in draw_now)])
        by_task[row["task_id"]].append(_episode(w, f_id, folder, p, row, i in draw_now))
    _write_tasks(w, f_id, folder, by_task)
    w.data(f"data/{f_id}/rows.js", f"rows/{f_id}", {"columns": COLUMNS, "rows": rows_out})
    figures = []
    for name, data in folder.figures:
        w.raw(f"figures/{f_id}/{name}", data)
        figures.append(f"figures/{f_id}/{name}")
    summary, manifest = _summary(folder), folder.manifest
    return {
        "id": f_id, "name": folder.name, "path": str(folder.path),
        "split": manifest.get("split"), "fingerprint": manifest.get("fingerprint"),
        "probe": manifest.get("probe"), "seeds": manifest.get("seeds"),
        "faults": manifest.get("faults"), "costs": manifest.get("costs"),
        "sandbox": None if manifest.get("sandbox") is None else describe(manifest["sandbox"]),
        "model": (summary or {}).get("model") or manifest.get("model"),
        "self_reported": folder.self_reported,
        "development": manifest.get("split") in SPLITS,
        "drawn": len(draw_now),
        "episodes": len(folder.rows), "policies": policies,
        "summary": None if summary is None else {
            "policies": summary["policies"], "model_arm": summary.get("model_arm"),
            "bootstrap": summary.get("bootstrap"), "rankings": summary.get("rankings")},
        "tasks": sorted(by_task), "with_calls": sum("calls" in r for r in folder.rows),
        "figures": figures}


def write_site(folders: list[Folder], dirs: list[Path], out: Path, pictures: str, workers: int,
               worst: int, progress: bool) -> dict:
    """Write the site of `folders` (read and checked) into the folder `out`; return what was
    written (`folders`, `episodes`, `pictures`, `files`, `bytes`, and `lazy`: the pictures not
    drawn, by path, for `serve` to draw on request)."""
    w = _Writer(out)
    for name in ("app.js", "style.css"):
        w.copy(ASSETS / name, f"assets/{name}")
    for name in PAGES:
        w.text(f"{name}.html", _page(name))
    site: dict = {"folders": [], "built_with": "python -m eval view " + " ".join(
        str(d) for d in dirs)}
    for f_id, folder in enumerate(folders):
        entry = _write_folder(w, f_id, folder, pick(folder, pictures, worst))
        site["folders"].append(entry)
        if progress:
            print(f"  {folder.name}: {len(folder.rows):,} episodes, "
                  f"{len(entry['policies'])} policies", flush=True)
    priced = [(f["name"], f["summary"]) for f in site["folders"] if _priced(f["summary"])]
    if priced:
        from eval.reports.figures import cost_figure
        (out / COST_FIGURE).parent.mkdir(exist_ok=True)
        cost_figure(priced, out / COST_FIGURE)
        site["cost_figure"] = COST_FIGURE
        w.count(out / COST_FIGURE)
    w.data("data/site.js", "site", site)
    w.draw(workers)
    return {"folders": len(folders), "episodes": sum(len(f.rows) for f in folders),
            "pictures": len(w.jobs), "files": w.files, "bytes": w.bytes, "lazy": w.lazy}
