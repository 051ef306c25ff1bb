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
from pathlib import Path

from eval.site.build import DEFAULT_OUT, build
from eval.site.pictures import PICTURES, WORST
from eval.site.server import serve


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
