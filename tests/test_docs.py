"""The ``kvtier`` commands shown in the README and ``docs/`` stay true.

Every command in a fenced ``bash`` block is parsed by the real ``kvtier`` parser (its
subcommand, every option and every value: sizes, integers, choices), so a renamed or
removed option, or a value kvtier would refuse, fails here. The cheap ones -- ``--help``
and single-capacity replays of the shipped trace -- are run in full, in a temporary
directory, and must exit 0.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from kvtier import cli

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(?:bash|sh|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def doc_commands() -> list[tuple[str, str]]:
    """``(file name, command)`` for every ``kvtier ...`` line of a bash block."""
    found = []
    for path in DOCS:
        for block in _FENCE.findall(path.read_text(encoding="utf-8")):
            for line in block.replace("\\\n", " ").splitlines():
                command = line.strip().removeprefix("$ ")
                if command.startswith("kvtier "):
                    command = re.sub(r"\s+#.*$", "", command)  # a trailing comment
                    found.append((path.name, command))
    return found


COMMANDS = doc_commands()


def _cheap(argv: list[str]) -> bool:
    if "--help" in argv:
        return True
    return argv[0] == "simulate" and not {"--trace", "--sweep", "--generate"} & set(argv)


def test_the_docs_show_commands() -> None:
    """The extraction itself works: the main ones are found."""
    shown = {c.split()[1] for _, c in COMMANDS}
    assert {"run", "simulate"} <= shown
    assert len(COMMANDS) >= 8


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_doc_command_parses(doc: str, command: str) -> None:
    argv = shlex.split(command)[1:]
    parser = cli.build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        if e.code == 0 and "--help" in argv:
            return
        pytest.fail(f"{doc}: `{command}` is refused by kvtier's parser")
    assert getattr(args, "_main", None) is not None, f"{doc}: `{command}` runs no command"


@pytest.mark.parametrize(
    ("doc", "command"),
    [c for c in COMMANDS if _cheap(shlex.split(c[1])[1:])],
    ids=[c for _, c in COMMANDS if _cheap(shlex.split(c)[1:])],
)
def test_cheap_doc_command_runs(
    doc: str,
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = shlex.split(command)[1:]
    try:
        status = cli.main([*argv, "--no-progress"] if argv[0] == "simulate" else argv)
    except SystemExit as e:  # --help
        status = int(e.code or 0)
    assert status == 0, f"{doc}: `{command}`: {capsys.readouterr().err}"
