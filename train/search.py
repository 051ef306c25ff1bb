"""`python -m train search`: the short search that picks an arm's algorithm, on validation only.

Each algorithm named trains from each seed for a short budget (`--timesteps`, 200,000 by
default against the sweeps' 1.5M) with its own hyperparameters (`HYPERPARAMETERS`, the ones a
sweep of it would take) and the shared settings given; its model is validated as every run's
is (every `validation_stride`-th independent unit of `public`, fault seed 100) and never graded:
`regenerated`, the split a sweep is judged on, is not read, so the choice cannot be fitted to
it. The choice: the lowest best validation mean gap, averaged over the seeds (a tie goes to the
algorithm named first). The best of a run's validations is an optimistic figure, equally so for
every algorithm; with one or two seeds and 161 validation episodes, a difference of a few
dollars is noise, which the report says beside the table.

A search folder holds `search.json` (the arm, the algorithms, the seeds and the shared recipe),
one `train ppo` run per algorithm and seed in `<algo>/seed_<k>/` (without its final grading:
config, validation, checkpoints, best model, TensorBoard, learning curve), and the outcome:
`summary.json`, `report.md` and `search.png` (every run's validation curve). Re-running the
same command into the folder resumes it as a sweep does (finished runs are kept, the others
continue from their last checkpoint); another search into it is refused.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from eval.sweeps.provenance import describe
from eval.reports.figures import save_figure, subplots
from eval.grading.runfolder import lock, prepare, write_atomic

from .config import ALGOS, TrainConfig
from .sweep import run_local

# The recipe's settings a search shares between its algorithms; an algorithm's own
# hyperparameters are its defaults (tuning them is not what this search is for).
SHARED = ("timesteps", "n_envs", "eval_every", "validation_stride", "checkpoint_every",
          "torch_threads")
TIMESTEPS = 200_000


def parse_algos(text: str) -> tuple[str, ...]:
    """`ppo,maskable_ppo,recurrent_ppo`: each a known algorithm, each once, in the order given."""
    algos = tuple(a.strip() for a in text.split(","))
    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        raise ValueError(f"--algos: unknown algorithm {unknown[0]!r}; valid: {', '.join(ALGOS)}")
    if len(set(algos)) != len(algos):
        raise ValueError(f"--algos: {text!r} names an algorithm twice")
    if len(algos) < 2:
        raise ValueError("--algos: a search compares at least two algorithms")
    return algos


def run_config(env: str, algo: str, seed: int, out: Path, shared: dict) -> TrainConfig:
    return TrainConfig(env=env, algo=algo, seed=seed,
                       out=str((out / algo / f"seed_{seed}").resolve()), **shared)


def record(env: str, algos: tuple[str, ...], seeds: tuple[int, ...], shared: dict) -> dict:
    """What `search.json` holds: the arm, the algorithms, the seeds, the shared settings (every
    one of SHARED, defaults included, so that a later default cannot change a folder's meaning)."""
    return {"env": env, "algos": list(algos), "seeds": list(seeds),
            "shared": {k: shared.get(k, getattr(TrainConfig, k)) for k in SHARED}}


def check(wanted: dict, out: Path) -> None:
    """Nothing, or an error if `out` holds anything but this search; writes nothing."""
    path = out / "search.json"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path} is not a search record ({exc})") from None
        if saved != wanted:
            diff = sorted(k for k in wanted.keys() | saved.keys() if saved.get(k) != wanted.get(k))
            raise ValueError(f"{out} holds another search (differs in {', '.join(diff)}); use "
                             "another --out folder")
    elif out.exists() and any(p.name != ".lock" for p in out.iterdir()):
        raise ValueError(f"{out} is not empty and holds no search.json; pick an empty folder")


def search(env: str, algos: tuple[str, ...], seeds: tuple[int, ...], out: Path,
           shared: dict | None = None, workers: int | None = None) -> dict:
    """Train every run of the search in `out` not yet done, then summarize them all."""
    shared = {"timesteps": TIMESTEPS, **(shared or {})}
    unknown = sorted(set(shared) - set(SHARED))
    if unknown:
        raise ValueError(f"a search shares only {', '.join(SHARED)}; not {', '.join(unknown)} "
                         "(each algorithm takes its own defaults)")
    # every configuration built (and so checked) before anything is written
    configs = [run_config(env, a, s, out, shared) for a in algos for s in seeds]
    if workers is None:
        workers = max(1, min(len(configs), (os.cpu_count() or 1) // configs[0].torch_threads))
    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    wanted = record(env, algos, seeds, shared)
    check(wanted, out)
    prepare(out)
    with lock(out):
        write_atomic(out / "search.json", json.dumps(wanted, indent=2) + "\n")
        todo = [c for c in configs if not (Path(c.out) / "result.json").exists()]
        print(f"search {out}: {len(algos)} algorithms x {len(seeds)} seeds on {env} "
              f"({len(configs) - len(todo)} of {len(configs)} runs done), {workers} at a time",
              flush=True)
        if todo:
            run_local(todo, workers, grade=False, name=lambda c: f"{c.algo} seed {c.seed}")
        summary = summarize(wanted, out)
        write_atomic(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        write_atomic(out / "report.md", report(summary, out.name))
        figure(summary, out)
    return summary


def summarize(wanted: dict, out: Path) -> dict:
    """Per algorithm, each seed's best and last validation and training time, the mean best
    validation gap over the seeds, and the choice."""
    algos: dict = {}
    machines = []
    for algo in wanted["algos"]:
        runs = []
        for seed in wanted["seeds"]:
            folder = out / algo / f"seed_{seed}"
            result = json.loads((folder / "result.json").read_text())
            curve = [json.loads(line) for line in
                     (folder / "validation.jsonl").read_text().splitlines()]
            machines += result.get("machines", [])
            runs.append({"seed": seed, "best_mean_gap": result["best"]["mean_gap"],
                         "best_exact_rate": result["best"]["exact_rate"],
                         "best_timesteps": result["best"]["timesteps"],
                         "last_mean_gap": curve[-1]["mean_gap"],
                         "timesteps": result["timesteps"],
                         "train_seconds": result["train_seconds"],
                         "curve": [[c["timesteps"], c["mean_gap"]] for c in curve]})
        algos[algo] = {"name": ALGOS[algo].name, "runs": runs,
                       "mean_best_gap": sum(r["best_mean_gap"] for r in runs) / len(runs)}
    chosen = min(wanted["algos"], key=lambda a: algos[a]["mean_best_gap"])  # first on ties
    return {**wanted, "algorithms": algos, "chosen": chosen,
            "episodes": json.loads((out / wanted["algos"][0] / f"seed_{wanted['seeds'][0]}" /
                                    "best.json").read_text())["episodes"],
            "machines": sorted({describe(m) for m in machines})}


def report(summary: dict, name: str) -> str:
    shared = summary["shared"]
    lines = [f"# Algorithm search: {name}", "",
             f"`{summary['env']}`, {shared['timesteps']:,} training steps a run, seeds "
             f"{summary['seeds']}; each algorithm with its own default hyperparameters. Judged "
             f"on validation only ({summary['episodes']} episodes of `public`, one independent "
             f"unit in {shared['validation_stride']}, every {shared['eval_every']:,} steps); `regenerated` is not read. Money in dollars.",
             "", f"Trained on: {'; '.join(summary['machines']) or 'not recorded'}.", "",
             "| algorithm | seed | best validation gap | at step | exact | last validation gap "
             "| train s | steps/s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for algo, entry in summary["algorithms"].items():
        for r in entry["runs"]:
            lines.append(f"| {entry['name']} | {r['seed']} | {r['best_mean_gap']:.2f} | "
                         f"{r['best_timesteps']:,} | {100 * r['best_exact_rate']:.1f}% | "
                         f"{r['last_mean_gap']:.2f} | {r['train_seconds']:.0f} | "
                         f"{r['timesteps'] / r['train_seconds']:,.0f} |")
    lines += ["", "| algorithm | mean best validation gap over the seeds |", "|---|---:|"]
    for algo, entry in summary["algorithms"].items():
        mark = " (chosen)" if algo == summary["chosen"] else ""
        lines.append(f"| {entry['name']}{mark} | {entry['mean_best_gap']:.2f} |")
    lines += ["", f"Chosen: `{summary['chosen']}`, the lowest mean best validation gap. A short "
              "budget on few seeds: a difference of a few dollars between algorithms is within "
              "the noise of one run's validation, and an algorithm that learns slower but "
              "further is not seen here.", ""]
    return "\n".join(lines)


def figure(summary: dict, out: Path) -> None:
    """Every run's validation mean gap against training steps, one colour per algorithm."""
    fig, ax = subplots(figsize=(7, 4.2))
    for i, (algo, entry) in enumerate(summary["algorithms"].items()):
        for j, r in enumerate(entry["runs"]):
            steps, gaps = zip(*r["curve"])
            ax.plot(steps, gaps, marker=".", color=f"C{i}",
                    label=entry["name"] if j == 0 else None)
    ax.set_xlabel("training steps")
    ax.set_ylabel("validation mean gap ($)")
    ax.set_title(f"algorithm search on {summary['env']} (chosen: {summary['chosen']})")
    ax.legend()
    save_figure(fig, out / "search.png")
