"""Result files: what the figures came from."""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.results import git_commit, write_result


def test_a_result_names_the_commit_it_is_given_else_the_one_checked_out(tmp_path: Path) -> None:
    started = write_result("x", {}, [], tmp_path / "a.json", commit="abc1234")
    assert json.loads(started.read_text())["commit"] == "abc1234"
    now = write_result("x", {}, [], tmp_path / "b.json")
    assert json.loads(now.read_text())["commit"] == git_commit()
