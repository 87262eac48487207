"""README.md stays a user's guide: at most 250 lines, every page of docs/ linked from it, and
every relative link (and #anchor) in README.md and docs/*.md pointing at something that exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file: lower case, punctuation but '-' and '_' dropped,
    spaces as '-' (fenced code is no heading)."""
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^#+\s+(.*)", line)):
            found.add(re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-"))
    return found


def broken_links(path: Path) -> list[str]:
    problems = []
    for target in _LINK.findall(path.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            problems.append(f"{path.name}: {target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{path.name}: {target} (no such heading)")
    return problems


def test_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def test_readme_links_every_docs_page():
    linked = {Path(target.partition("#")[0]).name for target in _LINK.findall(README.read_text())
              if target.startswith("docs/")}
    assert {page.name for page in DOCS} <= linked


def test_relative_links_resolve():
    assert [problem for path in [README, *DOCS] for problem in broken_links(path)] == []


def test_anchor_rule_matches_github():
    page = ROOT / "docs" / "ros.md"
    assert {"the-graphs-own-memory", "processes-or-containers", "on-a-robot-with-ros-2"} <= anchors(page)
