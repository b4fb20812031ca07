"""The README stays short, and every link in it leads somewhere inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_is_short_and_its_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links
    for link in links:
        assert "://" not in link and not link.startswith(".."), f"README links outside the repository: {link}"
        target = link.split("#")[0]
        assert not target or (ROOT / target).exists(), f"README links to a missing file: {link}"


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert page.name in nav, f"docs/{page.name} is not in mkdocs.yml's nav"
