"""Every fenced code block of README.md and docs/*.md is tested: each sits under a marker line
naming it (``<!-- block: ID -->``), and some test fetches it by that name with
``doc_block(PAGE, ID)`` to run it (a shell block's commands, a Python block's code) or, for an
output block, to compare it with what the command prints. A block added without a marker, or
with a marker no test fetches, fails here; so does a test that fetches a block no page has."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.docs.blocks import REPO, doc_blocks, pages

TESTS = REPO / "tests"
#: Where blocks are read, not tested: the reader and this check.
NOT_TESTS = {TESTS / "docs" / "blocks.py", Path(__file__).resolve()}


def _fetches() -> dict[tuple[str, str], list[str]]:
    """(page, id) -> the places in the test suite that fetch that block and run: a call
    ``doc_block("PAGE", "ID")`` inside a test function, or inside a helper or fixture some other
    code in the suite names."""
    trees = {
        path: ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(TESTS.rglob("*.py"))
        if path.resolve() not in NOT_TESTS
    }
    used_names = {
        node.id for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.Name)
    } | {node.attr for tree in trees.values() for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path, tree in trees.items():
        for top in tree.body:
            for node in ast.walk(top):
                if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "doc_block"):
                    continue
                args = node.args
                assert len(args) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args), (
                    f"{path.relative_to(REPO)}:{node.lineno}: doc_block takes the page and the id as literal strings"
                )
                name = getattr(top, "name", None)
                runs = name is not None and (name.startswith("test_") or name in used_names)
                if runs:
                    found[(args[0].value, args[1].value)].append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_every_block_has_a_unique_marker() -> None:
    unnamed = [f"{b.page}:{b.line}" for page in pages() for b in doc_blocks(page) if b.id is None]
    assert unnamed == [], f"blocks without a `<!-- block: ID -->` line right above them: {unnamed}"
    for page in pages():
        ids = [b.id for b in doc_blocks(page)]
        assert len(ids) == len(set(ids)), f"{page}: block ids used twice: {sorted(i for i in ids if ids.count(i) > 1)}"


def test_every_block_is_fetched_by_a_test_and_every_fetch_names_a_block() -> None:
    fetches = _fetches()
    blocks = {(b.page, b.id) for page in pages() for b in doc_blocks(page)}
    untested = sorted(f"{page} {block_id}" for page, block_id in blocks - set(fetches))
    assert untested == [], f"blocks no test fetches with doc_block(PAGE, ID): {untested}"
    stale = sorted(f"{key} at {where}" for key, where in fetches.items() if key not in blocks)
    assert stale == [], f"tests fetch blocks no page has: {stale}"


def test_the_pages_are_the_readme_and_docs() -> None:
    found = pages()
    assert found[0] == "README.md" and len(found) > 1 and all(p.startswith("docs/") for p in found[1:]), found
