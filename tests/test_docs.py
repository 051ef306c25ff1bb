"""The repository states its own rules (docs/world.md): every section the code cites exists
there, and nothing points outside the repository for them."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [p for p in ROOT.rglob("*") if p.suffix in (".py", ".md", ".toml", ".txt")
           and ".venv" not in p.parts and "results" not in p.parts and "runs" not in p.parts
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
