"""Every file the repository tracks cites only what the repository holds.

Three kinds of citation are refused:

- a path outside the repository: the ``shared`` folder of a parent directory, its ``reference`` folder, or an
  upper-case design file by its bare name (the design is ``docs/design.md``);
- a ``docs/<path>.md`` (or a relative Markdown link) naming a file that does not exist;
- an ADR by number (``docs/adr/NNNN`` or "ADR NNNN") that has no file ``docs/adr/NNNN-*.md``.

The scanner is tried first on a small tree written here with one citation of each kind, so the test of the real
tree can fail.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Folders never scanned when git cannot list the tracked files (virtual environments, run data, caches).
UNTRACKED_DIRS = {".git", ".venv", "var", "node_modules", "__pycache__", ".pytest_cache", ".hypothesis", "artifacts"}

# Built from pieces so that this file does not cite what it looks for.
_SHARED = "shared"
OUTSIDE = [
    (re.compile(r"\.\./+" + _SHARED + r"\b"), "a path in the parent directory's shared folder"),
    (re.compile(r"(?<![\w.-])" + _SHARED + r"/reference\b"), "a shared reference folder outside the repository"),
    (re.compile(r"(?<![\w/.-])" + "DES" + r"IGN\.md\b"), "the design by a bare name (it is docs/design.md)"),
]
DOCS_FILE = re.compile(r"(?<![\w/.-])docs/[\w/.-]+?\.md\b")
ADR_NUMBER = re.compile(r"(?<![\w/.-])docs/adr/(\d{4})|\bADR (\d{4})\b")
MARKDOWN_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def tracked_files(root: Path) -> list[Path]:
    """The files git tracks under ``root`` (relative paths); without git, every file outside ``UNTRACKED_DIRS``."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True, timeout=60).stdout
        return [Path(p) for p in out.decode().split("\0") if p]
    except (OSError, subprocess.SubprocessError):
        return sorted(p.relative_to(root) for p in root.rglob("*")
                      if p.is_file() and not UNTRACKED_DIRS.intersection(p.relative_to(root).parts))


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (or one that is not UTF-8)."""
    try:
        data = path.read_bytes()
    except OSError:  # a tracked file deleted in the work tree
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def adr_numbers(root: Path) -> set[str]:
    """The four-digit numbers of the ADR files under ``root/docs/adr``."""
    return {p.name[:4] for p in (root / "docs" / "adr").glob("[0-9][0-9][0-9][0-9]-*.md")}


def bad_citations(root: Path, files: list[Path]) -> list[str]:
    """``path:line: what`` for every citation in ``files`` (relative to ``root``) the rules of this module refuse."""
    adrs = adr_numbers(root)
    found = []
    for rel in files:
        text = text_of(root / rel)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            where = f"{rel}:{number}"
            for pattern, what in OUTSIDE:
                for m in pattern.finditer(line):
                    found.append(f"{where}: {m.group(0)!r} cites {what}")
            for m in DOCS_FILE.finditer(line):
                if not (root / m.group(0)).is_file():
                    found.append(f"{where}: {m.group(0)!r} does not exist")
            for m in ADR_NUMBER.finditer(line):
                adr = m.group(1) or m.group(2)
                if adr not in adrs:
                    found.append(f"{where}: {m.group(0)!r} names no file docs/adr/{adr}-*.md")
            if rel.suffix == ".md":
                for m in MARKDOWN_LINK.finditer(line):
                    target = m.group(1)
                    if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, file: ...
                        continue
                    if not (root / rel.parent / target).exists():
                        found.append(f"{where}: link {target!r} does not exist")
    return found


# The small tree's citations, built from pieces so that the scan of the real tree does not read them as its own.
D, A = "docs", "ADR"


@pytest.fixture
def small_tree(tmp_path: Path) -> Path:
    """A repository of a few files: one good citation of each kind and one bad one of each."""
    (tmp_path / D / "adr").mkdir(parents=True)
    (tmp_path / D / "adr" / "0003-borrowing.md").write_text(f"# {A} 0003\n")
    (tmp_path / D / "guide.md").write_text("See [the ADR](adr/0003-borrowing.md) and [none](adr/0009-x.md).\n")
    (tmp_path / "code.py").write_text(
        f"# {D}/guide.md, {A} 0003 and {D}/adr/0003 exist\n"
        f"# figures from ../{_SHARED}/prices.md\n"
        f"# facts in {_SHARED}/reference/training.md\n"
        f"# the states of DES{'IGN'}.md\n"
        f"# see {D}/missing.md and {A} 0042 and {D}/adr/0007\n"
        f"# https://example.org/{D}/elsewhere.md is someone else's\n"
    )
    return tmp_path


def test_the_scanner_finds_each_kind_of_bad_citation(small_tree):
    found = bad_citations(small_tree, [Path(D, "guide.md"), Path("code.py")])
    expected = [
        f"{D}/guide.md:1: link 'adr/0009-x.md' does not exist",
        f"code.py:2: '../{_SHARED}' cites a path in the parent directory's shared folder",
        f"code.py:3: '{_SHARED}/reference' cites a shared reference folder outside the repository",
        f"code.py:4: 'DES{'IGN'}.md' cites the design by a bare name (it is docs/design.md)",
        f"code.py:5: '{D}/missing.md' does not exist",
        f"code.py:5: '{A} 0042' names no file {D}/adr/0042-*.md",
        f"code.py:5: '{D}/adr/0007' names no file {D}/adr/0007-*.md",
    ]
    assert sorted(found) == sorted(expected)


def test_the_scanner_reads_the_tree_without_git(small_tree):
    """Outside a git checkout the files come from the tree itself, less run data."""
    (small_tree / "var").mkdir()
    (small_tree / "var" / "run.log").write_text(f"{D}/missing.md\n")
    assert sorted(map(str, tracked_files(small_tree))) == ["code.py", f"{D}/adr/0003-borrowing.md", f"{D}/guide.md"]


def test_every_tracked_file_cites_only_what_the_repository_holds():
    files = tracked_files(ROOT)
    assert Path("docs/design.md") in files
    found = bad_citations(ROOT, files)
    assert not found, "citations of files the repository does not hold:\n" + "\n".join(found)
