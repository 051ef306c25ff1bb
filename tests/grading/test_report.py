"""The printed headline table and the report: readable on a 100-column terminal, with a legend
that says what the gap is, which way is better and what each column means; the reference's own
figures (premature, cogs) explained; and no policy compared with itself."""

import json

import pytest

import eval.experiments.headline as headline
from finality_gym import load_corpus
from eval.reports.report import headline_table, report_markdown
from eval.stats.summary import summarize

MODEL = "ppo:models/ppo_full.zip"


@pytest.fixture(scope="module")
def nine(tmp_path_factory):
    """The nine policies on public, one seed: the printed table's real content."""
    out = tmp_path_factory.mktemp("headline")
    summary = headline.run(out, workers=1, progress=False, seeds=1, echo=False)
    return summary, [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def row(table: str, name: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(name + " "))


def test_the_printed_table_fits_100_columns_and_has_a_legend(nine):
    summary, _ = nine
    printed = headline_table(summary)
    assert max(len(line) for line in printed.splitlines()) <= 100
    header = printed.splitlines()[0]
    for column in ("policy", "exact", "pass^1", "mean gap $ [95% CI]", "vs baseline $ [95% CI]",
                   "premature"):
        assert column in header
    legend = " ".join(printed.split("\n\n", 1)[1].split())
    assert "excess loss in dollars" in legend and "privileged reference" in legend
    assert "lower is better" in legend
    assert "minus that of finality_gate, the best unprivileged scripted policy" in legend
    for name in summary["policies"]:
        assert row(printed, name)


def test_the_baseline_row_is_not_compared_with_itself(nine):
    summary, _ = nine
    gate = summary["policies"]["finality_gate"]["vs_baseline"]
    assert gate["baseline"] == "finality_gate" and gate["mean_gap_diff"] == 0  # as before
    for text in (headline_table(summary), report_markdown(summary, "t")):
        assert "baseline" in row(text.replace("| ", ""), "finality_gate")
        assert "0.00 [0.00, 0.00]" not in row(text.replace("| ", ""), "finality_gate")


def test_the_references_premature_rate_and_cogs_are_explained(nine):
    summary, _ = nine
    oracle = summary["policies"]["finality_oracle"]
    assert oracle["premature"] > 0.9  # what the legend explains
    printed = " ".join(headline_table(summary).split())
    report = report_markdown(summary, "t")
    for text in (printed, report):
        assert "before t_det" in text
        assert "finality_oracle is the privileged reference" in text and "by design" in text
    assert "cogs is the cost of the goods shipped" in report
    for name, p in summary["policies"].items():  # the note's claim: more cogs, unpaid goods
        if p["loss_breakdown"]["cogs"] > oracle["loss_breakdown"]["cogs"]:
            assert p["failure_labels"]["shipped_unpaid"] > 0, name


def test_a_learned_model_graded_alone_is_compared_with_nothing(nine):
    _, rows = nine
    alone = [{**r, "policy": MODEL} for r in rows if r["policy"] == "react"]
    summary = summarize(alone, load_corpus("public"), [MODEL], [0], replicates=200)
    assert "vs_baseline" not in summary["policies"][MODEL]
    for text in (headline_table(summary), report_markdown(summary, "t")):
        assert "vs baseline $" not in text and f"gap - {MODEL}" not in text
        assert "no scripted baseline in this run" in text
        assert "+0.00" not in row(text.replace("| ", ""), MODEL)


def test_a_named_baseline_is_kept_without_a_scripted_policy(nine):
    _, rows = nine
    pair = [{**r, "policy": MODEL} for r in rows if r["policy"] == "react"]
    pair += [r for r in rows if r["policy"] == "finality_oracle"]
    summary = summarize(pair, load_corpus("public"), [MODEL, "finality_oracle"], [0], replicates=200,
                        baseline=MODEL)
    assert summary["policies"]["finality_oracle"]["vs_baseline"]["baseline"] == MODEL
    assert "the baseline this run names" in " ".join(headline_table(summary).split())
