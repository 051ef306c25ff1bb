"""The results site, `python -m eval view`: every graded episode of results folders as a static
site that opens from disk (or is served to one page with `--serve`).

`view` (the command: its options and `main`), `build` (a site built beside `--out` and put in
its place only once whole), `runs` (the graded runs under each DIR, read whole and checked:
checksums, split, the world they pinned), `tree` (a DIR walked and read following no link),
`transcripts` (a model episode's conversation as its page shows it), `replays` (each episode
rebuilt by the engine from its recorded calls, and checked against its row), `pictures` (the
timeline pictures: which are drawn at build time, and drawing them), `pages` (the site's pages
and the data files they load), `server` (`--serve`: the token and the Host check) and the
pages' one script and style sheet, `app.js` and `style.css`.

May import: finality_gym, agents, eval.grading, eval.stats, and eval.reports for its figures
(the timeline picture's PNG and the models' cost figure). Nothing else of eval: a site shows
the results folders the other commands wrote and runs none of them, and no other room of eval
imports it but the leaderboard's (`eval/board/page.py` builds the site of its entries'
public-split runs), and `eval/__main__.py`.
"""
