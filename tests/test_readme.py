"""The README's sample output is what the tool prints today (so it cannot go stale)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_the_readme_sample_output_is_printed_verbatim(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```\n\$ ddpcheck (.+?)\n(.*?)```", readme, re.S)
    assert block, "the README has no sample run"
    args, expected = block.group(1).split(), block.group(2)
    command = [sys.executable, "-m", "ddpcheck", *args, "--report-dir", str(tmp_path), "--color", "never"]
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    printed = done.stdout.splitlines()
    lines = [line for line in expected.splitlines() if line.strip()]
    assert lines and all(line in printed for line in lines), "\n".join(
        line for line in lines if line not in printed
    )


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


def test_the_readme_describes_simulate_as_the_help_does() -> None:
    """The README's --simulate bullet starts from the help text, word for word (line breaks aside)."""
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert _help_of("--simulate") in readme
