"""Names in report.md are the submitter's text: rendered by real Markdown renderers, a policy
whose path holds HTML, a `|` and a backtick shows as its name and nothing else, in tables of
the right shape (eval/reports/report.py's `md_name`)."""

from html.parser import HTMLParser

import pytest

from agents.registry import HEADLINE
from eval.__main__ import main
from eval.reports.format import md_name

EVIL_FOLDER = "<img src=x onerror=alert(1)>|`x"
POLICY = '''from agents.scripted import FinalityGate


class P(FinalityGate):
    name = "<script>alert(2)</script>"
'''
TASKS = "pub-000a-pending_settle,pub-000b-pending_fail"  # one twin pair


def renderers() -> list:
    """The real renderers installed: markdown-it-py as GitHub renders (its `gfm-like`: raw
    HTML on, GFM tables, links made of bare addresses) and Python-Markdown with tables."""
    found = []
    try:
        from markdown_it import MarkdownIt
        found.append(("markdown-it", MarkdownIt("gfm-like").render))
    except ImportError:
        pass
    try:
        import markdown
        found.append(("python-markdown",
                      lambda text: markdown.markdown(text, extensions=["tables"])))
    except ImportError:
        pass
    if not found:
        pytest.skip("no Markdown renderer installed (markdown-it-py or Markdown)")
    return found


class Page(HTMLParser):
    """What a rendered page holds: every start tag, every table as rows of cell texts, and the
    text of every code element."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.tables: list[list[list[str]]] = []
        self.codes: list[str] = []
        self._cell: list[str] | None = None
        self._code: list[str] | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "code":
            self._code = []

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "code":
            self.codes.append("".join(self._code))
            self._code = None

    def handle_data(self, data):
        for part in (self._cell, self._code):
            if part is not None:
                part.append(data)


def shown(text: str, renderer: str, cell: bool = True) -> str:
    """A code span's content as GFM shows it. In a table cell GFM drops the `\\` of an escaped
    `|` (as the cell's syntax requires); Python-Markdown keeps it (its cells never split inside
    a code span), and it strips a code span's edge spaces, which CommonMark keeps."""
    if renderer != "python-markdown":
        return text
    return (text.replace("\\|", "|") if cell else text).strip()


@pytest.mark.filterwarnings("ignore:Tight layout not applied")  # the figure's long name
def test_a_policy_whose_path_holds_html_a_pipe_and_a_backtick_shows_as_its_name(tmp_path):
    folder = tmp_path / EVIL_FOLDER
    folder.mkdir()
    (folder / "p.py").write_text(POLICY)
    spec = f"{folder / 'p.py'}:P"
    assert main(["headline", "--out", str(tmp_path / "run"), "--no-progress", "--seeds", "1",
                 "--workers", "1", "--sandbox", "off", "--tasks", TASKS,
                 "--policies", f"finality_gate,{spec}"]) == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "<script" not in report  # the class's own name is in the rows, not the report
    for renderer, render in renderers():
        page = Page(render(report))
        assert "img" not in page.tags and "script" not in page.tags, renderer
        assert len(page.tables) == 6, renderer  # headline, pass^k, 2 per archetype, loss, labels
        for table in page.tables:
            assert len({len(row) for row in table}) == 1, (renderer, table)  # every row whole
            assert [shown(row[0], renderer) for row in table[1:]] == ["finality_gate", spec], (
                renderer, table)
        # the rankings' lines show it too, whole
        assert sum(code == spec for code in page.codes) >= 2, (renderer, page.codes)


PLAIN = [*HEADLINE, "finality_oracle", "sop:poll_interval=30,max_polls=6",
         "plan:60,original,120,ship", "ppo:models/ppo_full.zip", "model:gpt-4o-mini",
         "model:Qwen/Qwen2.5-7B-Instruct", "agents.scripted:FinalityGate"]
TRICKY = ["<img src=x onerror=alert(1)>", "a`b", "``", "`x", "x`", " x", "x ", "a|b", "a\\|b",
          "*x*", "_x_", "__init__", "[x](http://e.x)", "&amp;", "www.e.x", "http://e.x",
          "a b", "x\\", "# x", "- x", "<!-- x", "a\nb|c"]


def test_plain_names_are_written_as_they_are():
    for name in PLAIN:
        assert md_name(name) == md_name(name, cell=True) == name


@pytest.mark.parametrize("name", TRICKY)
def test_any_other_name_shows_as_itself_inline_and_in_a_table(name):
    want = name.replace("\n", "\\n")  # a line break cannot be shown: written as its escape
    for renderer, render in renderers():
        page = Page(render(f"policy {md_name(name)} here\n\n| policy | x |\n|---|---|\n"
                           f"| {md_name(name, cell=True)} | 1 |\n"))
        assert set(page.tags) <= {"p", "code", "table", "thead", "tbody", "tr", "th", "td"}, (
            renderer, page.tags)
        exact = want if renderer == "markdown-it" else want.strip()
        assert shown(page.codes[0], renderer, cell=False) == exact, renderer  # inline
        cell, one = page.tables[0][1]
        assert shown(cell, renderer) == exact and one == "1", (renderer, page.tables)
