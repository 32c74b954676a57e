"""The README's code runs as printed: its first Python block is a whole program."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_readme_pipeline_runs(tmp_path: Path) -> None:
    """The README's pipeline passes its self test (a failed one raises: exit 1), runs, and
    prints its statistics, and nothing else: rxstream logs nothing unconfigured."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no python block"
    program = tmp_path / "readme_pipeline.py"
    program.write_text(blocks[0])
    done = subprocess.run(
        [sys.executable, str(program)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line}
    assert rows["video"][1:4] == ["stream", "48", "48"]
    assert (done.stdout.splitlines()[0].split()[0], done.stderr) == ("stage", "")
