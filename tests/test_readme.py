"""Every Python block of the README runs as written.

Each fenced ``python`` block is run on its own, in a fresh namespace and a temporary
working directory, so an undefined name, a renamed argument or a path the reader
does not have fails here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.M | re.S)


def test_the_readme_has_its_examples() -> None:
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("number", range(len(BLOCKS)))
def test_a_readme_example_runs(
    number: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code = compile(BLOCKS[number], f"README.md python block {number + 1}", "exec")
    exec(code, {"__name__": f"readme_{number + 1}"})
    assert os.listdir(tmp_path) == [], "an example leaves no file behind"
