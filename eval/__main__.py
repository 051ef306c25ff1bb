"""`python -m eval NAME ...`: the benchmark's experiments and tools, one table of subcommands.

Each command is a module exporting `add_arguments(parser)` and `main(args) -> int`; the table
below is the only place a command is named. `main`'s exit status: 0 done, 2 bad input (nothing
graded), 3 some episode left ungraded (an endpoint failed past every retry, or a budget or cap
stopped the run: re-run into the same folder to complete it).
"""

from __future__ import annotations

import os

# numpy's OpenBLAS starts a thread per core for every matrix product, which the bootstrap's
# small products (replicates x units) only wait on: one thread made the headline's statistics
# 9 times faster on two busy cores, with the same results. Set before numpy is imported, for
# this process and the workers it starts; a value set outside is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib
import sys

from agents.model import ConfigurationError

from eval.grading.grader import Incomplete

EXIT_BAD_INPUT = 2
EXIT_INCOMPLETE = 3

# name: (module, what it does: the line `python -m eval --help` shows)
COMMANDS = {
    "headline": ("eval.experiments.headline",
                 "nine policies x 321 tasks x 5 seeds, tables and figures (the main job)"),
    "ablation": ("eval.experiments.ablation",
                 "each fault family alone and removed, no late_chargeback, loss x delay"),
    "tuning": ("eval.experiments.tuning", "sop's knobs on public, re-measured on regenerated"),
    "costs": ("eval.experiments.costs",
              "45 cost configurations, re-priced from the headline records"),
    "plans": ("eval.experiments.plans", "1,215 open-loop plans on 40 tasks against the reference"),
    "all": ("eval.experiments.everything",
            "all of the above into one folder, with an index report"),
    "model": ("eval.models.command",
              "a language model behind a Chat Completions endpoint, acting through tool calls"),
    "show": ("eval.experiments.show", "one episode of one policy, drawn as a timeline PNG"),
    "baselines": ("eval.sweeps.baselines",
                  "the learned baselines of the sweeps given, one table (into the README)"),
    "versus": ("eval.sweeps.versus",
               "two sweeps of one probe arm compared (say RecurrentPPO's and PPO's): A - B"),
    "view": ("eval.site.view",
             "every graded episode of results folders, as a static site (or --serve it)"),
    "import-inspect": ("eval.models.import_inspect",
                       "an inspect_ai log of eval/inspect_task.py as a model-arm results folder"),
    "import-verifiers": ("eval.models.import_verifiers",
                         "a vf-eval run of the finality-gym-env environment as a model-arm folder"),
    "submit": ("eval.board.submit",
               "a policy as a submission bundle for a leaderboard (one file, hashed)"),
    "verify": ("eval.board.verify",
               "bundles graded again on the private split (and the public), into a board"),
    "leaderboard": ("eval.board.page",
                    "a board as a ranked page with paired comparisons, ready to publish"),
    "private-baselines": ("eval.board.baselines",
                          "the sweeps' seeds on a board's private split, into their summaries"),
    "keygen": ("eval.grading.master_seed",
               "a private split's master seed (128 random bits) into a new file of mode 0600"),
}


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"    {name:<19}{text}" for name, (_, text) in COMMANDS.items())
    top = argparse.ArgumentParser(prog="python -m eval", description=f"{__doc__}\n{listing}",
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = top.add_subparsers(dest="command", required=True)
    for name, (module, text) in COMMANDS.items():
        command = sub.add_parser(name, help=text, description=text)
        command.set_defaults(module=module)
        importlib.import_module(module).add_arguments(command)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if getattr(args, "backend", "local") == "ray":  # Ray missing: say so before any output
            from eval.grading.distributed import require_ray
            require_ray()
        return importlib.import_module(args.module).main(args)
    except Incomplete as exc:
        print(exc, file=sys.stderr)
        return EXIT_INCOMPLETE
    except (ValueError, OSError, ConfigurationError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
