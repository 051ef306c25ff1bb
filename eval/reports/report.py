"""The headline's tables (printed, and in `report.md`) from a summary, and the run header every
report shares (the development note, the sandbox line). Text goes through `eval.reports.format`
(names through `md_name`: a submitter's spec is untrusted text); figures are
`eval.reports.figures`."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from agents.scripted import FinalityOracle
from finality_gym import ARCHETYPES
from finality_gym.corpus import PRIVATE
from finality_gym.tasks import HANDOVER_AT

from eval.grading.labels import LABELS
from eval.reports.format import interval, md_name, money, share, table, text_table
from eval.stats.summary import best_scripted

TERMINAL_WIDTH = 100

# The loss breakdown is absolute, not against the reference, so the reference itself shows one of
# the largest cogs: said under the table, before a reader takes that column for mistakes.
COGS_NOTE = (
    "These are the deductions from each position (position = cash - cogs - liability - dispute - "
    "escalation), not losses against the reference. cogs is the cost of the goods shipped, "
    "charged whenever goods left; the order value, once collected, covers it, so it counts "
    "sales, not mistakes. The reference ships every order whose card pays and so "
    "carries more cogs than any policy that refuses or misses such sales; only shipping orders "
    "that are never paid gives more. liability is money held beyond the goods delivered, dispute "
    "the fee it draws, escalation the specialist's fee. Compare policies by gap.")


def save(out: Path, name: str, result: dict, report: str) -> None:
    """An experiment's outputs: `NAME.json` and `report.md` in its folder."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "report.md").write_text(report)


def _baseline(summary: dict) -> str | None:
    """The policy every `vs_baseline` is taken against; None in a run without an unprivileged
    scripted policy, which has no comparison (eval/stats/summary.py)."""
    vs = next(iter(summary["policies"].values())).get("vs_baseline")
    return vs["baseline"] if vs else None


def _vs_baseline(name: str, p: dict) -> str:
    """The baseline's own row says so rather than showing its zero difference from itself."""
    vs = p["vs_baseline"]
    if name == vs["baseline"]:
        return "baseline"
    return f"{vs['mean_gap_diff']:+,.2f} {interval(vs['mean_gap_diff_ci'])}"


def legend(summary: dict, full: bool, name=str) -> list[str]:
    """What the headline table's columns mean, one item each; `full` for report.md's table, which
    adds the paired halves. The reference's own premature rate is explained where it is shown,
    since a reader meets it before any definition. `name` writes a policy's name (`md_name`
    for Markdown)."""
    pols, k, base = summary["policies"], len(summary["seeds"]), _baseline(summary)
    items = [
        "gap: excess loss in dollars per episode against the privileged reference (the "
        "reference's position minus the policy's); lower is better, 0 is as good as the "
        "reference.",
        f"exact: share of episodes with gap 0. pass^{k}: share of tasks exact under "
        + ("their one seed." if k == 1 else f"all {k} seeds."),
        f"[95% CI]: bootstrap over the {summary['bootstrap']['units']} units of the split (a "
        "twin pair is one unit).",
    ]
    if base is None:
        items.append("vs baseline: no scripted baseline in this run, so no comparison; add an "
                     "unprivileged scripted policy (e.g. finality_gate) to --policies for one.")
    else:
        chosen = ("the best unprivileged scripted policy of the run by mean gap"
                  if base == best_scripted({n: p["mean_gap"] for n, p in pols.items()})
                  else "the baseline this run names")
        items.append(f"vs baseline: mean gap minus that of {name(base)}, {chosen}, with the "
                     f"paired 95% CI; below 0 is a lower loss than {name(base)}.")
    if full:
        items.append("paired settle / fail: mean gap on the settling and on the failing halves "
                     "of the twin pairs (the same case, the card settles or fails); avg: their "
                     "mean, the paired loss of the rankings.")
    premature = ("premature: share of episodes with an irreversible action (a disposition, a "
                 "fresh retry, a lapse) taken before t_det, the time the original capture's "
                 "outcome is determined; before it no tool can tell the outcome.")
    if FinalityOracle.name in pols:
        premature += (f" {name(FinalityOracle.name)} is the privileged reference: told the "
                      f"capture's fate, it acts at hand-over (t={HANDOVER_AT}), before t_det on "
                      "most tasks, so its premature rate is by design, not a mistake.")
    items.append(premature)
    if not full:
        items.append("Paired halves, per-archetype figures, loss breakdown, failure labels: "
                     "report.md and summary.json.")
    return items


def headline_table(summary: dict) -> str:
    """The headline as printed: the essential columns, within 100 characters a line for the
    nine policies, then the legend; report.md and summary.json keep every statistic."""
    pols, k, base = summary["policies"], len(summary["seeds"]), _baseline(summary)
    header = ["policy", "exact", f"pass^{k}", "mean gap $ [95% CI]",
              *(["vs baseline $ [95% CI]"] if base else []), "premature"]
    rows = [[name, share(p["exact"]), share(p["pass_k"][-1]),
             f"{money(p['mean_gap'])} {interval(p['mean_gap_ci'])}",
             *([_vs_baseline(name, p)] if base else []), share(p["premature"])]
            for name, p in pols.items()]
    notes = [textwrap.fill(item, TERMINAL_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
             for item in legend(summary, full=False)]
    return text_table(header, rows) + "\n\n" + "\n".join(notes)


def statistics_table(summary: dict) -> str:
    """The headline with every statistic, for report.md (markdown, no width limit)."""
    pols = summary["policies"]
    k = len(summary["seeds"])
    base = _baseline(summary)
    header = ["policy", "exact", "exact 95% CI", "mean gap $", "mean gap 95% CI",
              f"pass^{k}", "paired settle $", "paired fail $", "paired avg $", "premature",
              *(["vs baseline $ [95% CI]"] if base else [])]
    rows = []
    for name, p in pols.items():
        rows.append([md_name(name, cell=True), share(p["exact"]), interval(p["exact_ci"], share),
                     money(p["mean_gap"]),
                     interval(p["mean_gap_ci"]), share(p["pass_k"][-1]), money(p["paired"]["settle"]),
                     money(p["paired"]["fail"]), money(p["paired"]["average"]),
                     share(p["premature"]), *([_vs_baseline(name, p)] if base else [])])
    return table(header, rows)


def _sandbox_line(summary: dict) -> list[str]:
    """Where outside policies ran, and how models were loaded: said in the header, since a grade
    means little without it."""
    pickles = (["**Models unpickled** (`--trust-pickles`): code in the model files ran in the "
                "grader's process. Do not publish this grade as a leaderboard result.", ""]
               if summary.get("trust_pickles") else [])
    if "sandbox" not in summary:
        return pickles
    box = summary["sandbox"]
    if box == "off":
        return ["**Sandbox: off.** Outside policies ran as plain processes of the grader's user "
                "(`--sandbox off`): they could read the grader's memory and leave state for "
                "later cases. Do not publish this grade as a leaderboard result.", "", *pickles]
    channel = f" Each case's channel: {box['channel']}." if "channel" in box else ""
    return [f"**Sandbox: on** ({box['tool']}; self-tested before the first case). Each policy's "
            f"process: {box['process']}. Each case: {box['case']}.{channel} Limits per case: "
            f"{box['limits']['memory_mb']} MiB address space, {box['limits']['file_mb']} MiB "
            f"files, {box['limits']['cpu_s']} s CPU, {box['limits']['open_files']} open files.",
            "", *pickles]


def development_note(split: str) -> str | None:
    """What a grade on a published split proves, said wherever it is shown: the corpus ships
    with the package, so a policy can carry it and recognize its tasks (docs/trust.md)."""
    if split == PRIVATE:
        return None
    return (f"A development figure: the `{split}` split ships with the package, so a policy that "
            "carries the corpus can recognize its tasks and score better than it plays "
            "(docs/trust.md shows one that beats the finality gate this way); grades that count "
            "are graded on a private split.")


def report_markdown(summary: dict, title: str) -> str:
    pols = summary["policies"]
    k = len(summary["seeds"])
    cell = lambda name: md_name(name, cell=True)  # noqa: E731
    parts = [f"# {title}", "",
             f"Split `{summary['split']}` (fingerprint `{summary['fingerprint']}`), seeds "
             f"{summary['seeds']}, {summary['episodes']} graded episodes. Intervals: "
             f"{summary['bootstrap']['method']}, {summary['bootstrap']['replicates']} replicates "
             f"over {summary['bootstrap']['units']} units, generator seed "
             f"{summary['bootstrap']['seed']}. Money in dollars; gap = reference position - "
             "achieved position.", "",
             *([f"**{note}**", ""] if (note := development_note(summary["split"])) else []),
             *_sandbox_line(summary), "## Headline", "",
             statistics_table(summary), "",
             *(f"- {item}" for item in legend(summary, full=True, name=md_name)), "",
             "## pass^k (tau-bench estimator)", "",
             table(["policy"] + [f"pass^{i}" for i in range(1, k + 1)],
                    [[cell(n)] + [share(x) for x in p["pass_k"]] for n, p in pols.items()]), ""]
    archetypes = [a for a in ARCHETYPES if any(a in p["per_archetype"] for p in pols.values())]
    for metric, fmt, label in (("exact", share, "exact rate"), ("mean_gap", money, "mean gap $")):
        parts += [f"## Per archetype: {label}", "",
                  table(["policy"] + archetypes,
                         [[cell(n)] + [fmt(p["per_archetype"][a][metric]) if a in p["per_archetype"]
                                 else "" for a in archetypes] for n, p in pols.items()]), ""]
    parts += ["## Loss breakdown (mean $ per episode)", "",
              table(["policy", "cogs", "liability", "dispute", "escalation"],
                     [[cell(n)] + [money(p["loss_breakdown"][c]) for c in
                             ("cogs", "liability", "dispute", "escalation")]
                      for n, p in pols.items()]), "", COGS_NOTE, "",
              "## What kind of mistake (episodes per failure label)", "",
              table(["policy"] + list(LABELS),
                     [[cell(n)] + [str(p["failure_labels"][lab]) for lab in LABELS]
                      for n, p in pols.items()]), "",
              "## Rankings", "",
              f"- by exact rate: {', '.join(map(md_name, summary['rankings']['by_exact']))}",
              "- by paired loss: "
              f"{', '.join(map(md_name, summary['rankings']['by_paired_loss']))}",
              f"- places where they disagree: {summary['rankings']['disagreements']}", ""]
    return "\n".join(parts)
