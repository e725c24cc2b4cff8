"""The README is a short tour and docs/ holds the rest: both stay connected and true to the repo.

Checks, by reading files only (no subprocess, no JAX): the README is at most 250 lines; every
``docs/*.md`` page is linked from the README; every relative link in the README, the docs pages
and the example's README names an existing file and carries no ``#anchor`` (headings get
renamed; files are checked here, anchors would not be); every ``lra-*`` command the README
names is a console script of ``pyproject.toml``; the README shows the test command that
``.ci/run`` runs.
"""

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "examples" / "my_attention" / "README.md"]
MAX_README_LINES = 250

# [text](target) outside code (the text may wrap onto the next line); a target ends at the
# first space or closing parenthesis.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
# A console-script name: lra-<word>[-<word>...], not part of a longer word or hyphenated name.
SCRIPT = re.compile(r"(?<![\w-])lra-[a-z]+(?:-[a-z]+)*(?![\w-])")
PYTEST = re.compile(r"\S*python -m pytest[^\n]*")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a link inside code is not a link)."""
    return FENCE.sub("", text)


def _relative_links(page: Path) -> list[str]:
    targets = LINK.findall(_prose(page.read_text(encoding="utf-8")))
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move reference "
        "material to a docs/ page and link it"
    )


def test_docs_exist():
    assert len(DOCS) >= 8, [p.name for p in DOCS]


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t).resolve() for t in _relative_links(README)}
    unlinked = [p.name for p in DOCS if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    links = _relative_links(page)
    with_anchor = [t for t in links if "#" in t]
    assert not with_anchor, f"{page.name}: links with an anchor (link the file): {with_anchor}"
    missing = [t for t in links if not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)}: links to missing files: {missing}"


def test_readme_commands_are_console_scripts():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "scripts"
    ]
    named = set(SCRIPT.findall(README.read_text(encoding="utf-8")))
    assert {"lra-train", "lra-data"} <= named  # the two set-up commands are there
    unknown = sorted(named - set(scripts))
    assert not unknown, f"README names commands pyproject.toml does not install: {unknown}"


def test_readme_shows_the_ci_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    lines = [line for line in ci.splitlines() if not line.lstrip().startswith("#")]
    commands = [m.group().strip() for line in lines for m in PYTEST.finditer(line)]
    assert commands, ".ci/run runs no `python -m pytest` command"
    readme = README.read_text(encoding="utf-8")
    for command in commands:
        assert command in readme, f"README.md does not show CI's test command: {command}"


def test_link_pattern_finds_links_and_skips_code():
    text = "see [a](docs/a.md) and [b\nc](https://x.org/b)\n```\n[c](docs/c.md)\n```\n"
    assert LINK.findall(_prose(text)) == ["docs/a.md", "https://x.org/b"]
    assert SCRIPT.findall("`.venv/bin/lra-check-attention x`, transnormer-lra-text") == [
        "lra-check-attention"
    ]
