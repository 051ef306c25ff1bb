"""How fast the results site is on a headline folder (14,445 episodes): the build, its size, and
how long the browser takes to render the index and the episodes table.

    .venv/bin/python benchmarks/view.py [--headline results/headline] [--out /tmp/site]
                                        [--screenshots docs/figures]

Grades the headline into `--headline` first if it is not there (what `make run` writes), builds
the site with the default pictures (`--pictures some`), then loads pages in Debian's headless
chromium and reads the time the page's script took to render (`data-render-ms`, from the
script's start to the last row drawn) and the browser's wall time for the whole load. With
`--screenshots`, saves `view_index.png` and `view_episode.png` there (the README's pictures).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import eval.experiments.headline as headline  # noqa: E402
import eval.site.view as view  # noqa: E402
from eval.grading.runfolder import read_rows  # noqa: E402

CHROMIUM = [shutil.which("chromium") or "chromium", "--headless", "--no-sandbox",
            "--disable-gpu", "--no-first-run", "--virtual-time-budget=30000"]


def load(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    run = subprocess.run([*CHROMIUM, "--dump-dom", url], capture_output=True, text=True,
                         timeout=300, check=True)
    wall = time.perf_counter() - started
    found = re.search(r'data-render-ms="(\d+)"', run.stdout)
    if found is None:
        raise RuntimeError(f"{url} did not render: {run.stdout[-2000:]}")
    return wall, int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headline", type=Path, default=ROOT / "results" / "headline")
    parser.add_argument("--out", type=Path, default=Path("/tmp/finality-site"))
    parser.add_argument("--screenshots", type=Path, default=None)
    args = parser.parse_args()
    if not (args.headline / "summary.json").exists():
        headline.run(args.headline, workers=2, progress=False, echo=False)
    rows = read_rows(args.headline / "episodes.jsonl")
    built = view.build([args.headline], args.out, pictures="some", workers=2)
    print(f"build: {built['episodes']:,} episodes, {built['pictures']} pictures, "
          f"{built['files']:,} files, {built['bytes'] / 1e6:.1f} MB in {built['seconds']:.1f} s "
          f"({sum('calls' in r for r in rows):,} episodes with their calls)")
    # the first of its largest gap: one the site draws (`--pictures some`)
    worst = max((r for r in rows if r["policy"] == "react"), key=lambda r: r["gap"])
    pages = {"index": (args.out / "index.html").as_uri(),
             "episodes (first 500 of 14,445, by gap)": (args.out / "episodes.html").as_uri() + "#f=0",
             "episodes, one archetype": (args.out / "episodes.html").as_uri()
             + f"#f=0&archetype={worst['archetype']}"}
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    pages["one episode"] = ((args.out / "episode.html").as_uri() + f"#f=0&p="
                            f"{policies.index(worst['policy'])}&t={worst['task_id']}"
                            f"&s={worst['seed']}")
    for name, url in pages.items():
        wall, render = load(url)
        print(f"{name}: rendered by its script in {render} ms; chromium start to DOM "
              f"{wall:.1f} s")
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
        for name, url, height in (("view_index.png", pages["index"], 1100),
                                  ("view_episode.png", pages["one episode"], 1500)):
            subprocess.run([*CHROMIUM, f"--screenshot={args.screenshots / name}",
                            f"--window-size=1400,{height}", "--hide-scrollbars", url],
                           capture_output=True, timeout=300, check=True)
            print(f"wrote {args.screenshots / name}")
    print(json.dumps({k: v for k, v in built.items() if k != "lazy"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
