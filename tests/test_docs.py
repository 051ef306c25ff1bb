"""The repository states its own rules (docs/world.md): every section the code cites exists
there, and nothing points outside the repository for them."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for p in ROOT.rglob("*") if p.suffix in (".py", ".md", ".toml", ".txt")
           and not any(part.startswith(".venv") for part in p.parts)  # .venv-verifiers too
           and "results" not in p.parts and "runs" not in p.parts
           and p.name != "test_docs.py"]
CITATION = re.compile(r"docs/world\.md`?\s+sections?\s+((?:\d+(?:\.\d+)?(?:,\s*|\s+and\s+|\s+to\s+)?)+)")


def sections() -> set[str]:
    text = (ROOT / "docs" / "world.md").read_text()
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.M))


def test_every_cited_section_exists():
    known = sections()
    assert {str(n) for n in range(1, 13)} <= known
    cited = 0
    for path in SOURCES:
        text = " ".join(path.read_text(errors="ignore").split())  # citations wrap lines
        for match in CITATION.finditer(text):
            for number in re.findall(r"\d+(?:\.\d+)?", match.group(1)):
                cited += 1
                assert number in known, f"{path.relative_to(ROOT)} cites section {number}"
    assert cited >= 40


def test_nothing_points_outside_the_repository_for_the_rules():
    """A person who clones the repository has only the repository: no relative path climbs out
    of it, and the rules are cited by their section here, never by another document's name."""
    for path in SOURCES:
        text = path.read_text(errors="ignore")
        assert not re.search(r"(?<![\w.])\.\./\w", text), path
        assert not re.search(r"\bSPEC\b", text), path


# The README is the front door: short, every link resolves, its tool table is the engine's.

README = ROOT / "README.md"
DOC_PAGES = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", flags=re.M | re.S)


def test_the_readme_is_at_most_300_lines():
    assert len(README.read_text().splitlines()) <= 300


def test_every_relative_link_of_the_readme_and_the_docs_points_at_a_file_here():
    checked = 0
    for page in DOC_PAGES:
        text = FENCE.sub("", page.read_text())
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            assert path.is_relative_to(ROOT), f"{page.relative_to(ROOT)}: {target} leaves the repository"
            assert path.exists(), f"{page.relative_to(ROOT)}: {target} does not exist"
            checked += 1
    assert checked >= 10


# A path of the repository named in backticks, as docs and docstrings name a module
# (`agents/sandbox/host.py`, `tests/grading/test_trust.py::name`, `agents.scripted:CLASS` aside).
NAMED_PATH = re.compile(r"`((?:finality_gym|agents|eval|train|tests|benchmarks|docs)/"
                        r"[\w/.\-]*[\w/])(?::\w+|::[\w\[\]-]+)?`")


def test_every_path_the_docs_and_docstrings_name_exists():
    """A file moved or renamed leaves no doc, README or docstring pointing at its old place."""
    named = [(source, m.group(1)) for source in SOURCES if source.name != "CHANGELOG.md"
             for m in NAMED_PATH.finditer(source.read_text())]
    assert len(named) > 100
    missing = [f"{source.relative_to(ROOT)}: {path}" for source, path in named
               if not (ROOT / path).exists()]
    assert not missing, missing


def test_every_docs_page_is_linked_from_the_readme():
    targets = {(ROOT / t.split("#", 1)[0]).resolve() for t in LINK.findall(README.read_text())}
    for page in DOC_PAGES[1:]:
        assert page.resolve() in targets, f"{page.relative_to(ROOT)} is not linked from the README"


def test_the_readme_tool_table_lists_exactly_the_tools_of_the_tool_table():
    from finality_gym.tools import TOOL_TABLE

    section = README.read_text().split("\n## The twelve tools\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\|\s*`(\w+)`", section, flags=re.M)
    assert tuple(listed) == tuple(t["name"] for t in TOOL_TABLE)


def test_the_citation_names_the_packaged_version_and_the_license():
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]
    citation = (ROOT / "CITATION.cff").read_text()
    assert re.search(rf"^version: \"?{re.escape(version)}\"?$", citation, re.M)
    assert re.search(r"^license: MIT$", citation, re.M)
    assert "MIT License" in (ROOT / "LICENSE").read_text()


def test_the_readme_baselines_table_is_the_one_its_sweep_folders_generate():
    """The learned-baselines table is written by `python -m eval baselines` from the sweep
    folders its marker names (docs/sweeps/: each sweep's summary.json, report.md, seeds.png),
    never typed: regenerated here, it must be the README's, and every folder must be there."""
    from eval.sweeps.baselines import baselines_table, sources_in

    sources = sources_in(README)
    assert sources and all((s / "summary.json").is_file() for s in sources)
    assert baselines_table(sources, README.parent) in README.read_text()


def test_the_readmes_minimal_policy_runs_from_anywhere_and_prints_dollars(tmp_path):
    """The README's policy file, as a reader saves it, run outside the repository: it imports
    the installed package only, and prints its gap in dollars, as the prose around it speaks."""
    import subprocess
    import sys
    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    (tmp_path / "my_policy.py").write_text(code)
    done = subprocess.run([sys.executable, "my_policy.py"], cwd=tmp_path, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"(ship|refund) gap \$\d+\.\d\d\n", done.stdout), done.stdout
