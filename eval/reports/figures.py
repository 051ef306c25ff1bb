"""Every figure of eval's reports, drawn headless: the headline's two, the model arm's cost figure,
and an episode's timeline saved as a PNG. An experiment's own figure (the ablation's grid, a
sweep's seeds) stays in its module and takes `subplots` and `save_figure` from here.

Figures are matplotlib `Figure`s saved through Agg, never pyplot's: pyplot keeps every figure in
a global registry until it is closed, and importing it costs the main job a third of a second
(the PNGs are the same bytes either way)."""

from __future__ import annotations

from pathlib import Path


def subplots(*grid: int, **options):
    """A new figure and its axes, as pyplot's `subplots(*grid, figsize=..., ...)` makes them."""
    from matplotlib.figure import Figure
    figure = Figure(figsize=options.pop("figsize", None))
    return figure, figure.subplots(*grid, **options)


def save_figure(fig, path: Path) -> None:
    """Lay the figure out and write it as a PNG at the reports' resolution."""
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def figure_exact_vs_pass(summary: dict, path: Path) -> None:
    """Single-seed exact rate against pass^k at the largest k: consistency, not just luck."""
    pols = summary["policies"]
    k = len(summary["seeds"])
    fig, ax = subplots(figsize=(6.4, 5.2))
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls="--", label="pass^k = exact rate")
    for name, p in pols.items():
        ax.scatter(p["exact"], p["pass_k"][-1], s=40)
        ax.annotate(name, (p["exact"], p["pass_k"][-1]), textcoords="offset points",
                    xytext=(5, 3), fontsize=8)
    ax.set_xlim(0, 1.05)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("exact rate (single seed, pass^1)")
    ax.set_ylabel(f"pass^{k} (exact under all {k} seeds)")
    ax.set_title(f"Exact rate vs pass^{k} ({summary['split']}, {summary['fingerprint']})")
    ax.legend(loc="upper left", fontsize=8)
    save_figure(fig, path)


def figure_paired(summary: dict, path: Path) -> None:
    """Mean gap on the settling and the failing halves of the twin pairs, per policy."""
    pols = summary["policies"]
    names = list(pols)
    xs = range(len(names))
    fig, ax = subplots(figsize=(8, 4.6))
    w = 0.38
    ax.bar([x - w / 2 for x in xs], [pols[n]["paired"]["settle"] for n in names], w,
           label="settling halves")
    ax.bar([x + w / 2 for x in xs], [pols[n]["paired"]["fail"] for n in names], w,
           label="failing halves")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("mean gap ($)")
    ax.set_title("Paired halves: the same case, the card settles or fails")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def save_png(image, path: Path) -> None:
    from matplotlib.image import imsave
    path.parent.mkdir(parents=True, exist_ok=True)
    imsave(path, image, format="png")


def cost_figure(models: list[tuple[str, dict]], path: Path) -> None:
    """Mean gap (with its interval) against cost per episode, one point per model run given as
    (label, its summary): what a better grade costs. Runs without prices have no cost and are
    left out by the caller."""
    fig, ax = subplots(figsize=(7.5, 4.6))
    for i, (label, summary) in enumerate(models):
        name = next(p for p in summary["policies"] if p.startswith("model:"))
        p, arm = summary["policies"][name], summary["model_arm"][name]
        lo, hi = p["mean_gap_ci"]
        x = arm["cost_per_episode_usd"]
        ax.errorbar(x, p["mean_gap"], yerr=[[p["mean_gap"] - lo], [hi - p["mean_gap"]]],
                    fmt="o", color=f"C{i % 10}", capsize=3)
        ax.annotate(label, (x, p["mean_gap"]), textcoords="offset points", xytext=(6, 4),
                    fontsize=8)
    ax.set_xlabel("cost per episode ($, at the prices each run was given)")
    ax.set_ylabel("mean gap ($), 95% interval over units")
    ax.set_title("Models: mean gap against cost per episode", fontsize=10)
    ax.set_xlim(left=0)
    save_figure(fig, path)
