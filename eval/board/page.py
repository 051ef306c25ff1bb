"""`python -m eval leaderboard BOARD --out SITE`: a board's standings as a page to publish.

    SITE/index.html     the ranked entries of each group, the pairwise matrix, per archetype,
                        every entry's provenance, the entries not ranked and why
    SITE/board.json     the same standings for programs (`eval/board/standings.py`)
    SITE/episodes/      the results site (`eval view`) of the entries' public-split runs, which
                        the page links into

The page is static HTML (no script, nothing fetched) and shows only aggregates of the private
split: no private task, row, call or failure message reaches SITE. Every cell that holds a
number carries it in `data-v` (an interval's ends in `data-lo`, `data-hi`), for programs and
tests. SITE must be new, empty or an earlier leaderboard; it is built beside and replaces SITE
only once whole.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
from html import escape
from pathlib import Path

from agents.sandbox.self_test import describe
from finality_gym import ARCHETYPES

from eval.board.standings import read_board, standings
from eval.board.verify import run_folder
from eval.grading.runfolder import MANIFEST
from eval.grading.labels import LABELS
from eval.reports.format import interval as fmt_interval
from eval.reports.format import money, share
from eval.site.build import build

MARKER = ".finality-leaderboard"
STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:16px;color:#212529}
table{border-collapse:collapse;margin:6px 0 14px;font-variant-numeric:tabular-nums}
th,td{border-bottom:1px solid #dee2e6;padding:3px 8px;text-align:right;white-space:nowrap}
th{background:#f1f3f5}td.l,th.l{text-align:left}.flag{color:#e03131}.good{color:#2f9e44}
.meta{color:#495057}h2{font-size:17px;margin-top:26px}code{font-size:12px}"""


def _cell(value: float | None, text: str | None = None, interval=None, cls: str = "",
          fmt=money) -> str:
    """A number's cell: its text, its interval written by `fmt` (dollars, or `share` for a
    share, as on every other page), the raw values in data attributes for the page's tests."""
    attrs = f' data-v="{value!r}"' if value is not None else ""
    if interval is not None:
        attrs += f' data-lo="{interval[0]!r}" data-hi="{interval[1]!r}"'
        text = f"{text} {fmt_interval(interval, fmt)}"
    return f'<td{attrs}{f" class={cls!r}" if cls else ""}>{escape(text or "")}</td>'


def _ranking(group: dict, entries: dict, site_ids: dict) -> list[str]:
    seeds = len(group["entries"][0]["pass_k"])
    head = ["rank", "entry", "kind", "mean gap $ [95% CI]", "exact [95% CI]",
            f"pass^1 / pass^{seeds}", "premature", "cost / episode $", "public split gap $",
            "bundle"]
    out = ["<table class='ranking'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for e in group["entries"]:
        info = entries[e["name"]]
        public = info.get("public", {})
        claim = public.get("claim_outside") or []
        link = (f"<a href='episodes/episodes.html#f={site_ids[e['name']]}'>episodes</a>"
                if e["name"] in site_ids else "")
        out.append(
            f"<tr data-entry='{escape(e['name'])}'>"
            + _cell(e["rank"], str(e["rank"]) if e["rank"] else "ref (privileged)")
            + f"<td class='l'>{escape(e['name'])}</td><td class='l'>{escape(info['kind'])}</td>"
            + _cell(e["mean_gap"], f"{e['mean_gap']:.2f}", e["mean_gap_ci"], "gap")
            + _cell(e["exact"], share(e["exact"]), e["exact_ci"], "exact", share)
            + _cell(e["pass_k"][0], f"{share(e['pass_k'][0])} / {share(e['pass_k'][-1])}")
            + _cell(e["premature"], share(e["premature"]))
            + _cell(e.get("cost_per_episode_usd"), f"{e['cost_per_episode_usd']:.6f}"
                    if "cost_per_episode_usd" in e else "")
            + (f"<td class='l'>{public['mean_gap']:.2f} {link}"
               + (f" <span class='flag'>claim outside: {escape('; '.join(claim))}</span>"
                  if claim else (" <span class='good'>claim inside</span>"
                                 if info.get("claimed") else "")) + "</td>"
               if "mean_gap" in public else "<td></td>")
            + f"<td class='l'><code>{info['bundle_sha256'][:12]}</code></td></tr>")
    return out + ["</table>"]


def _pairwise(group: dict) -> list[str]:
    names = [e["name"] for e in group["entries"]]
    out = ["<table class='pairwise'><tr><th class='l'>row - column</th>"
           + "".join(f"<th>{escape(n)}</th>" for n in names) + "</tr>"]
    for a in names:
        cells = []
        for b in names:
            if a == b:
                cells.append("<td></td>")
                continue
            p = group["pairwise"][f"{a} - {b}"]
            lo, hi = p["diff_ci"]
            cells.append(f"<td data-a='{escape(a)}' data-b='{escape(b)}' data-v='{p['diff']!r}' "
                         f"data-lo='{lo!r}' data-hi='{hi!r}' data-p='{p['p_better']!r}'>"
                         f"{p['diff']:+.2f} [{lo:.2f}, {hi:.2f}]<br>P(better) "
                         f"{p['p_better']:.2f}</td>")
        out.append(f"<tr><th class='l'>{escape(a)}</th>{''.join(cells)}</tr>")
    return out + ["</table>"]


def _details(group: dict) -> list[str]:
    present = [a for a in ARCHETYPES if any(a in e["per_archetype"] for e in group["entries"])]
    out = ["<table class='archetypes'><tr><th class='l'>entry</th>"
           + "".join(f"<th>{a}</th>" for a in present)
           + "".join(f"<th>{label}</th>" for label in LABELS) + "</tr>"]
    for e in group["entries"]:
        out.append(f"<tr><td class='l'>{escape(e['name'])}</td>"
                   + "".join(_cell(e["per_archetype"][a]["mean_gap"],
                                   f"{e['per_archetype'][a]['mean_gap']:.2f}")
                             if a in e["per_archetype"] else "<td></td>" for a in present)
                   + "".join(_cell(e["failure_labels"][k], str(e["failure_labels"][k]))
                             for k in LABELS) + "</tr>")
    return out + ["</table>"]


def _yardsticks(group: dict) -> str:
    """The group's gate and its arm's best scripted rule (chosen on the public split), or that
    they were not entered: a rank means little without them."""
    best, gate = group.get("best_rule"), group.get("gate")
    return (f"This arm's best scripted rule on the public split: "
            f"{f'<b data-best-rule>{escape(best)}</b>' if best else 'not entered'}; the finality "
            f"gate: {f'<b data-gate>{escape(gate)}</b>' if gate else 'not entered'}.")


def _provenance(entries: dict) -> list[str]:
    out = ["<h2>Provenance</h2><table><tr><th class='l'>entry</th><th class='l'>bundle sha256"
           "</th><th class='l'>graded as</th><th class='l'>grader</th><th class='l'>private "
           "split</th><th class='l'>machine</th><th class='l'>verified</th></tr>"]
    for name, e in sorted(entries.items()):
        form = e["form"] + (f"; sandbox: {describe(e['sandbox'])}" if "sandbox" in e else "")
        if "sandbox_nodes" in e:  # graded on a Ray cluster: proven on each of its nodes
            nodes = e["sandbox_nodes"]
            form += (f"; proven on each of {nodes['nodes']} Ray nodes"
                     + ("" if nodes["as_the_grader"] else " (some with other layers than the grader's)"))
        if "served_as" in e:
            form += f"; the endpoint answered as {', '.join(e['served_as']) or '?'}"
        machine = e["machine"]
        out.append(f"<tr><td class='l'>{escape(name)}</td><td class='l'><code>"
                   f"{e['bundle_sha256']}</code></td><td class='l' style='white-space:normal;"
                   f"max-width:28em'>{escape(form)}</td><td class='l'>"
                   f"{escape(e['grader']['label'])}</td><td class='l'>"
                   f"{escape(e['private']['fingerprint'])}</td><td class='l'>"
                   f"{escape(machine['cpu'])}, {machine['cores']} cores, Python "
                   f"{escape(machine['python'])}</td><td class='l'>"
                   f"{escape(e.get('verified_at', ''))}</td></tr>")
    return out + ["</table>"]


def page(computed: dict, site_ids: dict) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>finality-gym "
             f"leaderboard</title><style>{STYLE}</style></head><body data-ready='1'>",
             "<h1>finality-gym leaderboard</h1><p class='meta'>Every entry was graded again by "
             "the grader named below, on a private split of the tasks that only the operator "
             "can make, and on the public split. Mean gap: the excess loss against the "
             "reference, in dollars per episode (lower is better); intervals are 95 % "
             "bootstraps over units (a twin pair, or a task), shared by every entry of a "
             "group, so the pairwise differences are paired.</p>"]
    for i, group in enumerate(computed["groups"]):
        parts += [f"<section class='group' data-group='{i}' data-probe='{escape(group['probe'])}'>"
                  f"<h2>{escape(group['key'])}</h2>",
                  f"<p class='meta'>{group['episodes']:,} private episodes an entry, "
                  f"{group['units']} units, {group['bootstrap']['replicates']} resamples. "
                  f"{_yardsticks(group)}</p>",
                  *_ranking(group, computed["entries"], site_ids),
                  "<h3>Pairwise: row minus column, mean gap $ on the shared episodes</h3>",
                  *_pairwise(group), "<h3>Mean gap $ per archetype, and failure labels</h3>",
                  *_details(group), "</section>"]
    if computed["not_ranked"]:
        parts.append("<h2>Not ranked</h2><table class='not-ranked'><tr><th class='l'>entry</th>"
                     "<th class='l'>status</th><th class='l'>why</th></tr>")
        parts += [f"<tr data-entry='{escape(e['name'])}'><td class='l'>{escape(e['name'])}</td>"
                  f"<td class='l'>{escape(e['status'])}</td><td class='l' style='white-space:"
                  f"normal'>{escape(e.get('public_reason') or '')}</td></tr>"
                  for e in computed["not_ranked"]]
        parts.append("</table>")
    parts += [*_provenance(computed["entries"]), "</body></html>"]
    return "\n".join(parts) + "\n"


def _check_out(out: Path) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise ValueError(f"--out {out} is not a folder")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(f"--out {out} holds something other than a leaderboard this command "
                         "built; give an empty or new folder")


def publish(board: Path, out: Path, pictures: str = "none") -> dict:
    """Build the leaderboard of `board` into `out` (see the module's docstring)."""
    computed = standings(read_board(board))
    _check_out(out)
    ranked = [e["name"] for g in computed["groups"] for e in g["entries"]]
    public = [n for n in ranked if (run_folder(board, "public", n) / MANIFEST).is_file()]
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.parent / f".{out.name}.building-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        if public:
            build([run_folder(board, "public", n) for n in public], staging / "episodes",
                  pictures=pictures, workers=1)
        site_ids = {name: i for i, name in enumerate(public)}
        (staging / "index.html").write_text(page(computed, site_ids))
        (staging / "board.json").write_text(json.dumps(computed, indent=2, allow_nan=False)
                                            + "\n")
        (staging / MARKER).write_text("built by `python -m eval leaderboard`\n")
        _check_out(out)
        if out.exists():
            shutil.rmtree(out)
        os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return computed


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("board", type=Path, help="a board `python -m eval verify` wrote")
    parser.add_argument("--out", type=Path, required=True, help="the site's folder")
    parser.add_argument("--pictures", choices=("none", "some"), default="none",
                        help="timeline pictures in the public episodes' site (some: the worst "
                             "of each entry)")


def main(args: argparse.Namespace) -> int:
    computed = publish(args.board, args.out, args.pictures)
    print(f"leaderboard: {sum(len(g['entries']) for g in computed['groups'])} entries in "
          f"{len(computed['groups'])} group(s), {len(computed['not_ranked'])} not ranked: "
          f"{args.out}/index.html")
    return 0
