"""The repository's docs stand alone: every relative link in the README, CONTRIBUTING.md and
docs/ resolves to a file of the repository (none points outside it), the README links every
docs page, and no page or example spec sends the reader to design notes outside the clone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Markdown links and images: ``[text](target)`` and ``![alt](target)``; the target ends at the
#: first space (an optional title follows) or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: Where the design notes lived before docs/ held them; a clone of the repository has neither.
OUTSIDE = re.compile(r"\.\./shared/|shared/DESIGN\.md|\bDESIGN\.md\b")


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def _user_facing_files() -> list[Path]:
    """The README, CONTRIBUTING.md, docs/ and the example specs: what a clone's reader opens."""
    return [*_pages(), *sorted((ROOT / "examples").glob("*.toml"))]


def relative_links(page: Path) -> list[str]:
    """Return the link targets of ``page`` that are paths, not URLs or in-page anchors."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_it_finds_the_links_of_a_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "See [a](docs/a.md), [b](b.md#part \"title\"), ![img](img/x.png), [web](https://x.org/y),\n"
        "[here](#top) and [mail](mailto:a@b.c).\n```\n[not](in-code.md)\n```\n"
    )
    assert relative_links(page) == ["docs/a.md", "b.md", "img/x.png"]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_it_resolves_every_relative_link_inside_the_repository(page):
    problems = []
    for target in relative_links(page):
        resolved = (page.parent / target).resolve()
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
    assert problems == [], f"{page.relative_to(ROOT)}: " + "; ".join(problems)


def test_it_links_every_docs_page_from_the_readme():
    linked = {(ROOT / target).resolve() for target in relative_links(ROOT / "README.md")}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == []


def test_no_page_or_example_points_to_design_notes_outside_the_repository():
    hits = []
    for path in _user_facing_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert hits == [], "\n".join(hits)
