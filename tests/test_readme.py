"""The README's sample output is what the tool prints today (so it cannot go stale)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
