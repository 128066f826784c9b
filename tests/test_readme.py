"""The README: short, linked to every docs page, its links absolute (it is the package's long description);
the docs pages' links resolve. Its commands and sample outputs are run by ``tests/test_docs.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_the_readme_is_read_in_five_minutes() -> None:
    """Issue 44: what it is, the two commands, one example of each front end with its output, the checks in
    a line each, links; everything else lives in docs/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 250
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", readme, re.M | re.S)
    commands = [
        line
        for lang, body in blocks
        if lang == "text" and body.startswith("$ ")
        for line in body.splitlines()
    ]
    for front_end in ("$ ddpcheck fixtures/", "$ ddpcheck run ", "$ ddpcheck judge ", "$ pytest"):
        assert any(line.startswith(front_end) for line in commands), f"no output shown for {front_end}"
    assert any(lang == "python" and body.startswith(">>> from") for lang, body in blocks), "no import shown"
    base = _project_urls()["Repository"].rstrip("/")
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    linked = set(re.findall(rf"{re.escape(base)}/blob/main/docs/([\w-]+\.md)", readme))
    assert pages - linked == set(), f"docs pages the README does not link: {sorted(pages - linked)}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(encoding="utf-8"), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_docs_links_name_files_and_headings_that_exist() -> None:
    """The docs pages link each other relatively (they are read in the repository): every link into the
    repository names a file that exists, and a heading of it where it names one."""
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if link.startswith(("https://", "http://")):
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            assert target.is_file(), f"{page.name}: {link} names no file"
            if anchor and target.suffix == ".md":
                assert anchor in _anchors(target), f"{page.name}: {link}: no such heading"


def _project_urls() -> dict[str, str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10: tomli, a dependency there (ddpcheck's config reads it too)
        import tomli as tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["urls"]


def test_readme_links_work_outside_the_repository() -> None:
    """The README is the package's long description (PyPI, ``pip show``): a relative link breaks there.
    Every link is absolute or an anchor of the README itself, and links into the repository name files
    that exist (so they cannot rot)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    base = _project_urls()["Repository"].rstrip("/")
    anchors = {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", readme, re.M)
    }
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links
    for link in links:
        if link.startswith("#"):
            assert link[1:] in anchors, f"no heading for {link}"
            continue
        assert link.startswith("https://"), f"relative link in the README: {link}"
        if "/blob/" in link or "/tree/" in link:  # into a repository: ours, at the project's one base
            assert link.startswith(f"{base}/blob/main/"), f"not under the Repository URL {base}: {link}"
            assert (ROOT / link.removeprefix(f"{base}/blob/main/")).is_file(), link


def test_project_urls_point_into_one_repository() -> None:
    urls = _project_urls()
    base = urls["Repository"].rstrip("/")
    assert {"Homepage", "Documentation", "Repository", "Changelog", "Issues"} <= set(urls)
    assert all(url.startswith(base) for url in urls.values()), urls
    assert (ROOT / urls["Changelog"].removeprefix(f"{base}/blob/main/")).is_file()


def _help_of(option: str) -> str:
    """The help text of one option, as ``ddpcheck --help`` prints it, on one line."""
    env = {**os.environ, "COLUMNS": "10000"}
    done = subprocess.run(
        [sys.executable, "-m", "ddpcheck", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    found = re.search(rf"^\s+{re.escape(option)}\s+(\S.*)$", done.stdout, re.M)
    assert found, f"--help has no line for {option}"
    return found.group(1).strip()


def test_the_docs_describe_simulate_as_the_help_does() -> None:
    """docs/command-line.md's --simulate bullet starts from the help text, word for word (line breaks
    aside)."""
    page = " ".join((ROOT / "docs" / "command-line.md").read_text(encoding="utf-8").split())
    assert _help_of("--simulate") in page
