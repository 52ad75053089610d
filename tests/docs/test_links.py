"""The README and docs/ link each other: every relative link names a file of the repository and,
with ``#anchor``, a heading of that page (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens). Every page of docs/ is reachable from the README's reference index."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.blocks import REPO, pages

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    return {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def _links(page: str) -> list[str]:
    text = re.sub(r"```.*?```", "", (REPO / page).read_text(encoding="utf-8"), flags=re.DOTALL)
    return [target for target in _LINK.findall(text) if "://" not in target]


def test_every_relative_link_names_a_file_and_heading() -> None:
    broken = []
    for page in pages():
        for target in _links(page):
            path, _, anchor = target.partition("#")
            file = (REPO / page).parent / path if path else REPO / page
            if not file.resolve().exists():
                broken.append(f"{page}: {target} (no such file)")
            elif anchor and (file.suffix != ".md" or anchor not in _anchors(file)):
                broken.append(f"{page}: {target} (no such heading)")
    assert broken == []


def test_the_readme_indexes_every_docs_page() -> None:
    readme_links = {target.partition("#")[0] for target in _links("README.md")}
    assert {p for p in pages() if p.startswith("docs/")} <= readme_links
