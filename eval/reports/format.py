"""The one place a number or a name becomes report text: money, shares, intervals, tables, and
names in Markdown (every report of eval writes through these; JSON keeps numbers, rounded by
`eval.stats.summary.rounded`).

Two number formats, each with its meaning: `money` (dollars with thousands separators, the
headline's and the experiments' tables) and `number` (two decimals and no separator, which the
sweeps' tables and the README's baselines table have always shown). `usd` writes cents as signed
dollars with the sign, for a single episode's figures.

Names in Markdown. A policy's name or spec is the submitter's text (an outside policy's spec is
its file's path: `outside/<img src=x onerror=alert(1)>/p.py:P`), and operators publish
`report.md` through Markdown renderers, so every name goes into Markdown through `md_name`:

- a plain name, letters and digits joined by single `_ . : , = + - /` (every built-in name and
  spec: `finality_gate`, `sop:poll_interval=30,max_polls=6`, `ppo:models/ppo_full.zip`,
  `model:gpt-4o-mini`), is written as it is: no HTML, entity, emphasis (an `_` only ever
  stands between two letters or digits, where CommonMark never reads it as emphasis), link or
  table syntax can be made of those characters, and the reports and tables already written
  keep their text (`| react |`); a name starting with `www.` is not plain (GFM would link it);
- any other name is a CommonMark code span, whose content a renderer shows literally (no
  HTML, no emphasis, no link): its fence is one backtick longer than the longest run of
  backticks in the name, a space pads it where the name begins or ends with a backtick or a
  space (one is stripped from each side again), characters that cannot be shown (a line
  break, which would end a table's row) are written as Python escapes (`\\n`), and in a table
  cell every `|` is escaped as `\\|`, which GFM's tables require even inside a code span (and
  show as `|`).

The printed headline (`headline_table`, a terminal's text) writes names as they are.
"""

from __future__ import annotations

import re

_PLAIN = re.compile(r"[A-Za-z0-9]+(?:[_.:,=+/-][A-Za-z0-9]+)*")


def md_name(name: str, cell: bool = False) -> str:
    """`name` as Markdown that shows it and nothing else (see the module's docstring); `cell`:
    for a table's cell."""
    name = str(name)
    if _PLAIN.fullmatch(name) and not name.lower().startswith("www."):
        return name
    shown = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in name)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", shown)), default=0) + 1)
    if shown[:1] in ("`", " ") or shown[-1:] in ("`", " ") or not shown:
        shown = f" {shown} "
    span = f"{fence}{shown}{fence}"
    return span.replace("|", "\\|") if cell else span


def money(x: float) -> str:
    """Dollars: `1,234.50`."""
    return f"{x:,.2f}"


def number(x: float) -> str:
    """Two decimals, no separator: `1234.50`."""
    return f"{x:.2f}"


def usd(cents: int) -> str:
    """Integer cents as signed dollars: `-$1,234.50`."""
    return f"{'-' if cents < 0 else ''}${abs(cents) / 100:,.2f}"


def interval(pair, fmt=money) -> str:
    """A 95% interval as `[low, high]`, each end written by `fmt`."""
    return f"[{fmt(pair[0])}, {fmt(pair[1])}]"


def share(x: float) -> str:
    """A share as a percentage: `12.5%`."""
    return f"{100 * x:.1f}%"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """A table for the terminal: every column padded to its widest cell (names left, numbers
    right) under a rule, so that it reads without a markdown viewer."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])
