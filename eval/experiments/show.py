"""`python -m eval show`: play one episode of one policy and save its timeline as a PNG.

    python -m eval show --policy P --task T --seed S [--split public] [--probe full]
                        [--out FILE.png]

The episode is played exactly as the grader plays it: the policy spec goes through
`agents.make_policy` (names, `sop:...`, `plan:...`, `ppo:PATH`, `FILE.py:CLASS`, ...), the brief
is `agents.brief_for`, the fault profile and costs are the grader's defaults, and the loop is
the grader's own (`finality_gym.policy.play`, which returns the ended `Episode` to draw with
`finality_gym.timeline.draw`, the env's `rgb_array` frame).
The picture is the final frame: what each system showed at each read, every call, and, since the
case has ended, what really happened and the outcome. Prints the disposition, the position, the
reference and the gap in dollars, and the PNG's path (default
`results/show/<policy>_<task>_s<seed>.png`).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from agents import PolicySpec, make_policy
from agents.sandbox.external import ExternalPolicy
from agents.spec import FORMS
from finality_gym import PROBE_ARMS, SPLITS, load_corpus
from finality_gym.policy import play

from eval.reports.figures import save_png
from eval.reports.format import usd

DEFAULT_DIR = Path("results") / "show"
FILE_SUFFIXES = (".zip", ".py")  # a saved model's, a policy file's: no part of the PNG's name
NAME_LIMIT = 80                  # characters of the policy spec in the PNG's name


def default_path(spec: str, task_id: str, seed: int) -> Path:
    """`results/show/<policy>_<task>_s<seed>.png`, a name safe on any filesystem. The spec's
    file names lose their suffix (`ppo:models/ppo_full.zip` gives `ppo_models_ppo_full`,
    `policies/mine.py:Mine` gives `policies_mine_Mine`), so the PNG's name has one; a spec too long
    keeps its head and its tail, where a model's file name is."""
    name = _clean(":".join(_unsuffixed(part) for part in PolicySpec.parse(spec).parts))
    if len(name) > NAME_LIMIT:
        name = f"{name[:20]}_{name[21 - NAME_LIMIT:]}"
    return DEFAULT_DIR / f"{name}_{_clean(task_id)}_s{seed}.png"


def _unsuffixed(part: str) -> str:
    for suffix in FILE_SUFFIXES:
        if part.lower().endswith(suffix):
            return part[:-len(suffix)]
    return part


def _clean(text: str) -> str:
    """Letters, digits, `.`, `-` and `_` only: each run of other characters (a spec's `:`, a
    path's `/` with the `.` or `..` beside it) becomes one `_`; no leading dot; never empty."""
    return re.sub(r"[^A-Za-z0-9-]*[^A-Za-z0-9._-][^A-Za-z0-9-]*", "_", text).strip("._-") or "x"


def show(spec: str, task_id: str, seed: int = 0, split: str = "public", probe: str = "full",
         out: Path | None = None):
    """Play the episode, write its picture; return (the PNG's path, the record)."""
    from finality_gym.timeline import draw
    if type(seed) is not int or seed < 0:
        raise ValueError(f"--seed must be a non-negative int, got {seed!r}")
    task = load_corpus(split).task(task_id)
    policy = make_policy(spec, probe=probe)  # a model is checked against the arm
    try:
        episode = play(policy, task, seed, probe=probe)
    finally:
        if isinstance(policy, ExternalPolicy):
            policy.close()
    path = Path(out) if out is not None else default_path(spec, task_id, seed)
    if path.suffix.lower() != ".png":
        raise ValueError(f"--out {path}: the picture is a PNG; give a path ending in .png")
    save_png(draw(episode), path)
    return path, episode.record()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policy", required=True,
                        help=f"a policy spec, of the forms {FORMS}")
    parser.add_argument("--task", required=True, help="a task id of the split, e.g. "
                        "pub-000b-pending_fail")
    parser.add_argument("--seed", type=int, default=0, help="the episode (fault) seed")
    parser.add_argument("--split", choices=list(SPLITS), default="public")
    parser.add_argument("--probe", choices=list(PROBE_ARMS), default="full")
    parser.add_argument("--out", type=Path, default=None,
                        help="the PNG to write (default results/show/<policy>_<task>_s<seed>.png)")
    parser.set_defaults(no_progress=True)


def main(args: argparse.Namespace) -> int:
    path, rec = show(args.policy, args.task, args.seed, split=args.split, probe=args.probe,
                     out=args.out)
    how = "lapsed (closed)" if rec.lapsed else rec.disposition
    print(f"{args.policy} on {args.task} seed {args.seed} ({args.split}, probe {args.probe}): "
          f"{how} at t={rec.end_t}; position {usd(rec.position)}, reference "
          f"{usd(rec.reference)}, gap {usd(rec.gap)}")
    print(f"wrote {path}")
    return 0
