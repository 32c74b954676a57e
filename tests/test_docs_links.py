"""The user docs (README.md, CHANGELOG.md, bench/README.md, docs/*.md) stand alone: every
relative link resolves inside the repository, no path leaves it, no tracker issue number.

docs/history/ is the dated log and may name what the project's tracker called things.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
USER_DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "bench" / "README.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.M)
_UP_PATH = re.compile(r"(?<![\w./])((?:\.\./)+[\w.\-/]*)")
# "issue 18", "Issue #14", "issues 14", "PR 3", and a bare "#18" in prose (not "video#1").
_ISSUE = re.compile(r"\b(?:issues?|pr|pull request)\s*#?\d+|(?:^|(?<=[\s(]))#\d+\b", re.I)


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def _prose(text: str) -> str:
    """The text with fenced blocks and inline code taken out."""
    return _CODE.sub("", _FENCE.sub("", text))


def _inside(target: Path) -> bool:
    return target.resolve().is_relative_to(ROOT)


@pytest.mark.parametrize("doc", USER_DOCS, ids=_ids(USER_DOCS))
def test_relative_links_resolve_inside_the_repository(doc: Path) -> None:
    """Every relative link's file exists and lies inside the repository."""
    broken = []
    for match in _LINK.finditer(_FENCE.sub("", doc.read_text())):
        href = match.group(1) or match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", href, re.I) or href.startswith("#"):
            continue
        path = href.split("#", 1)[0]
        target = doc.parent / path
        if not (_inside(target) and target.exists()):
            broken.append(href)
    assert broken == [], f"{doc.relative_to(ROOT)}: links that do not resolve: {broken}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=_ids(USER_DOCS))
def test_no_path_leaves_the_repository(doc: Path) -> None:
    """A `../` path anywhere in the text (code spans too) names a file of the repository."""
    outside = [
        found
        for found in _UP_PATH.findall(doc.read_text())
        if not (_inside(doc.parent / found) and (doc.parent / found).exists())
    ]
    assert outside == [], f"{doc.relative_to(ROOT)}: paths outside the repository: {outside}"


@pytest.mark.parametrize("doc", USER_DOCS, ids=_ids(USER_DOCS))
def test_no_issue_numbers_in_user_docs(doc: Path) -> None:
    """User docs say what a thing does, not which tracker issue asked for it."""
    found = [
        m.group(0) for m in _ISSUE.finditer(re.sub(r"\]\([^)]*\)", "]", _prose(doc.read_text())))
    ]
    assert found == [], f"{doc.relative_to(ROOT)}: issue numbers: {found}"


def test_the_user_docs_are_found() -> None:
    """The checks above run over the README, the changelog, bench/README.md and docs/."""
    assert {"README.md", "CHANGELOG.md", "bench/README.md", "docs/performance.md"} <= set(
        _ids(USER_DOCS)
    )
