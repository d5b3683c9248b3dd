"""The docs hold together: a short README, links that lead somewhere, no diary."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text()) <= 11_000


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_lead_to_files(page: Path) -> None:
    missing = [
        target
        for target in LINK.findall(page.read_text())
        if "://" not in target and not (page.parent / target).exists()
    ]
    assert missing == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_speak_of_the_product_not_of_how_it_was_made(page: Path) -> None:
    diary = re.compile(
        r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|this) session\b"
        r"|this VM|work period|not yet found",
        re.I,
    )
    assert diary.findall(page.read_text()) == []


def test_every_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme] == []
