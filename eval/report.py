"""Markdown tables and matplotlib figures from a summary (the headline's `report.md` and PNGs)."""

from __future__ import annotations

import json
from pathlib import Path

from finality_gym import ARCHETYPES

from .labels import LABELS


def save(out: Path, name: str, result: dict, report: str) -> None:
    """An experiment's outputs: `NAME.json` and `report.md` in its folder."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "report.md").write_text(report)


def _money(x: float) -> str:
    return f"{x:,.2f}"


def _ci(pair: list[float], fmt=_money) -> str:
    return f"[{fmt(pair[0])}, {fmt(pair[1])}]"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def headline_table(summary: dict) -> str:
    pols = summary["policies"]
    k = len(summary["seeds"])
    base = next(iter(pols.values()))["vs_baseline"]["baseline"]
    header = ["policy", "exact", "exact 95% CI", "mean gap $", "mean gap 95% CI",
              f"pass^{k}", "paired settle $", "paired fail $", "paired avg $", "premature",
              f"gap - {base} $ [95% CI]"]
    rows = []
    for name, p in pols.items():
        vs = p["vs_baseline"]
        rows.append([name, _pct(p["exact"]), _ci(p["exact_ci"], _pct), _money(p["mean_gap"]),
                     _ci(p["mean_gap_ci"]), _pct(p["pass_k"][-1]), _money(p["paired"]["settle"]),
                     _money(p["paired"]["fail"]), _money(p["paired"]["average"]),
                     _pct(p["premature"]),
                     f"{_money(vs['mean_gap_diff'])} {_ci(vs['mean_gap_diff_ci'])}"])
    return table(header, rows)


def report_markdown(summary: dict, title: str) -> str:
    pols = summary["policies"]
    k = len(summary["seeds"])
    parts = [f"# {title}", "",
             f"Split `{summary['split']}` (fingerprint `{summary['fingerprint']}`), seeds "
             f"{summary['seeds']}, {summary['episodes']} graded episodes. Intervals: "
             f"{summary['bootstrap']['method']}, {summary['bootstrap']['replicates']} replicates "
             f"over {summary['bootstrap']['units']} units, generator seed "
             f"{summary['bootstrap']['seed']}. Money in dollars; gap = reference position - "
             "achieved position.", "", "## Headline", "", headline_table(summary), "",
             "## pass^k (tau-bench estimator)", "",
             table(["policy"] + [f"pass^{i}" for i in range(1, k + 1)],
                    [[n] + [_pct(x) for x in p["pass_k"]] for n, p in pols.items()]), ""]
    archetypes = [a for a in ARCHETYPES if any(a in p["per_archetype"] for p in pols.values())]
    for metric, fmt, label in (("exact", _pct, "exact rate"), ("mean_gap", _money, "mean gap $")):
        parts += [f"## Per archetype: {label}", "",
                  table(["policy"] + archetypes,
                         [[n] + [fmt(p["per_archetype"][a][metric]) if a in p["per_archetype"]
                                 else "" for a in archetypes] for n, p in pols.items()]), ""]
    parts += ["## Loss breakdown (mean $ per episode)", "",
              table(["policy", "cogs", "liability", "dispute", "escalation"],
                     [[n] + [_money(p["loss_breakdown"][c]) for c in
                             ("cogs", "liability", "dispute", "escalation")]
                      for n, p in pols.items()]), "",
              "## What kind of mistake (episodes per failure label)", "",
              table(["policy"] + list(LABELS),
                     [[n] + [str(p["failure_labels"][lab]) for lab in LABELS]
                      for n, p in pols.items()]), "",
              "## Rankings", "",
              f"- by exact rate: {', '.join(summary['rankings']['by_exact'])}",
              f"- by paired loss: {', '.join(summary['rankings']['by_paired_loss'])}",
              f"- places where they disagree: {summary['rankings']['disagreements']}", ""]
    return "\n".join(parts)


def pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def figure_exact_vs_pass(summary: dict, path: Path) -> None:
    """Single-seed exact rate against pass^k at the largest k: consistency, not just luck."""
    plt = pyplot()
    pols = summary["policies"]
    k = len(summary["seeds"])
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure_paired(summary: dict, path: Path) -> None:
    """Mean gap on the settling and the failing halves of the twin pairs, per policy."""
    plt = pyplot()
    pols = summary["policies"]
    names = list(pols)
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(8, 4.6))
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
