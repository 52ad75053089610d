"""The fenced code blocks of README.md and docs/*.md, each found by the id its page gives it.

Every block is written right under a marker line naming it, ``<!-- block: ID -->`` (an HTML
comment: not shown on GitHub), so a test fetches exactly the block it runs with
``doc_block("README.md", "walkthrough")`` however the text around it moves.
`tests/docs/test_blocks_covered.py` checks that every block has a marker and that some test
fetches it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The pages whose blocks are tested: the README and every page of docs/.
PAGES = ("README.md", "docs/*.md")

_MARKER = re.compile(r"<!-- block: ([a-z0-9][a-z0-9-]*) -->")


@dataclass(frozen=True)
class DocBlock:
    """One fenced block: its page (relative to the repository), id, info string (the language:
    ``bash``, ``python``, ``text`` for output), text (without the fences) and first line."""

    page: str
    id: str | None
    lang: str
    text: str
    line: int


class DocBlockError(AssertionError):
    """A page's blocks cannot be read as promised: a fence left open, a marker with no block."""


def pages() -> list[str]:
    """Every page whose blocks are tested, relative to the repository root."""
    found: list[str] = []
    for pattern in PAGES:
        found.extend(sorted(str(p.relative_to(REPO)) for p in REPO.glob(pattern)))
    return found


def doc_blocks(page: str) -> list[DocBlock]:
    """The fenced blocks of `page` in order, with the id of the marker line right above each
    (None when there is none)."""
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    blocks: list[DocBlock] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        marker = _MARKER.fullmatch(line.strip())
        if marker and not (i + 1 < len(lines) and lines[i + 1].startswith("```")):
            raise DocBlockError(f"{page}:{i + 1}: marker {marker.group(1)!r} is not right above a fenced block")
        if line.startswith("```"):
            start = i
            i += 1
            while i < len(lines) and lines[i].rstrip() != "```":
                i += 1
            if i == len(lines):
                raise DocBlockError(f"{page}:{start + 1}: a fenced block is never closed")
            above = _MARKER.fullmatch(lines[start - 1].strip()) if start > 0 else None
            text = "\n".join(lines[start + 1 : i]) + "\n"
            blocks.append(DocBlock(page, above.group(1) if above else None, line[3:].strip(), text, start + 1))
        i += 1
    return blocks


def doc_block(page: str, block_id: str) -> DocBlock:
    """The block of `page` whose marker names `block_id` (exactly one must)."""
    found = [b for b in doc_blocks(page) if b.id == block_id]
    if len(found) != 1:
        raise DocBlockError(f"{page}: {len(found)} blocks named {block_id!r}, expected one")
    return found[0]


def commands(block: DocBlock) -> list[str]:
    """A shell block's commands, one per entry: backslash continuations joined, comment lines
    and trailing comments dropped (none of the documented commands holds a ``#`` of its own)."""
    joined = re.sub(r"\\\n\s*", "", block.text)
    lines = [line.split("#", 1)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line]
