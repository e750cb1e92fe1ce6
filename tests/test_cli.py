"""Every ordinary mistake a user makes with ``kvtier`` gets one line on stderr and exit 2.

Table-driven (issue 17, item 2): each case is a command line a user could type, and
the words its one-line answer must contain. Nothing is measured, replayed or loaded
for any of them: every option is checked before the work starts (``kvtier run``
would take seconds to build its model; the cases that reach torch say so).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier import cli
from kvtier.sim.trace import write_mooncake
from kvtier.sim.workload import WorkloadConfig, generate


def _unwritable_dir(tmp: Path) -> Path:
    """A directory nobody may create files in (root ignores mode bits: sysfs then)."""
    if os.geteuid() == 0:
        return Path("/sys")
    path = tmp / "readonly"
    path.mkdir(mode=0o500)
    return path


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


# (id, argv maker (gets tmp_path), words of the error line)
Case = tuple[str, Callable[[Path], list[str]], str]
CASES: list[Case] = [
    ("disk-dir-missing", lambda t: ["bench", "disk", "--dir", str(t / "nope")], "does not exist"),
    (
        "soak-window-0",
        lambda t: ["soak", "--sliding-window", "0"],
        "'--sliding-window': must be positive",
    ),
    (
        "soak-window-vllm",
        lambda t: ["soak", "--engine", "vllm", "--sliding-window", "16"],
        "the reference engine only",
    ),
    ("disk-dir-file", lambda t: ["bench", "disk", "--dir", str(t / "a-file")], "not a directory"),
    (
        "disk-dir-unwritable",
        lambda t: ["bench", "disk", "--dir", str(_unwritable_dir(t))],
        "cannot write in",
    ),
    ("disk-sizes-unit", lambda t: ["bench", "disk", "--sizes", "12QB"], "unknown unit in '12QB'"),
    ("disk-total-0", lambda t: ["bench", "disk", "--total", "0"], "--total: must be more than 0"),
    ("disk-repeats-0", lambda t: ["bench", "disk", "--repeats", "0"], "--repeats: must be a pos"),
    ("disk-io-threads-0", lambda t: ["bench", "disk", "--io-threads", "0"], "--io-threads: must"),
    ("disk-json-exists", lambda t: ["bench", "disk", "--json", str(t / "a-file")], "exists;"),
    (
        "remote-unreachable",
        lambda t: ["bench", "remote", "--url", "redis://127.0.0.1:1"],
        "no Redis answers at redis://127.0.0.1:1",
    ),
    ("remote-not-redis", lambda t: ["bench", "remote", "--url", "http://x"], "must be a redis://"),
    ("transfer-pages-bare-k", lambda t: ["bench", "transfer", "--pages", "16K"], "16KiB (x1024)"),
    ("transfer-blocks-0", lambda t: ["bench", "transfer", "--blocks", "1,0"], "--blocks: must"),
    ("transfer-ids", lambda t: ["bench", "transfer", "--ids", "sorted"], "'--ids'"),
    ("manager-pinned", lambda t: ["bench", "manager", "--blocks", "10"], "exceed --blocks"),
    ("run-policy-mru", lambda t: ["run", "--eviction-policy", "mru"], "invalid choice: 'mru'"),
    ("run-threads-0", lambda t: ["run", "--threads", "0"], "--threads: must be a positive"),
    ("run-turns-0", lambda t: ["run", "--turns", "0"], "'--turns': must be >= 1"),
    ("run-cpu-bytes-typo", lambda t: ["run", "--cpu-bytes", "12QB"], "unknown unit in '12QB'"),
    ("run-cpu-bytes-1TiB", lambda t: ["run", "--cpu-bytes", "1TiB"], "1.0 TiB asked but this"),
    (
        "run-disk-bytes-100TiB",
        lambda t: ["run", "--disk-path", str(t / "d"), "--disk-bytes", "100TiB"],
        "100.0 TiB asked but the file system of",
    ),
    (
        "run-disk-path-unwritable-parent",
        lambda t: ["run", "--disk-path", str(_unwritable_dir(t) / "kvtier")],
        "cannot create",
    ),
    ("run-disk-path-proc", lambda t: ["run", "--disk-path", "/proc/kvtier"], "cannot create"),
    ("run-disk-path-file", lambda t: ["run", "--disk-path", str(t / "a-file")], "not a directory"),
    (
        "run-json-unwritable",
        lambda t: ["run", "--json", str(t / "a-file" / "out.json")],
        "cannot write",
    ),
    ("run-json-proc", lambda t: ["run", "--json", "/proc/out.json"], "cannot write"),
    ("run-json-exists", lambda t: ["run", "--json", str(t / "a-file")], "never overwritten"),
    ("run-model-missing", lambda t: ["run", "--model", str(t / "nope")], "not a checkpoint"),
    ("simulate-block-size-0", lambda t: ["simulate", "--block-size", "0"], "--block-size: must"),
    ("simulate-capacity-0", lambda t: ["simulate", "--capacity", "0"], "'0' is 0 blocks"),
    ("simulate-capacity-0pct", lambda t: ["simulate", "--capacity", "0%"], "'0%' is 0 blocks"),
    ("simulate-threshold", lambda t: ["simulate", "--store-threshold", "-1"], "must be an integer"),
    ("simulate-empty", lambda t: ["simulate", "--trace", str(t / "empty.jsonl")], "no requests"),
    ("simulate-no-trace", lambda t: ["simulate", "--trace", str(t / "nope")], "is not a file"),
    ("simulate-policy", lambda t: ["simulate", "--policy", "nope"], "invalid choice: 'nope'"),
    ("simulate-kv-bytes", lambda t: ["simulate", "--kv-bytes-per-token", "x"], "expected a byte"),
    ("unknown-command", lambda t: ["simulat"], "invalid choice: 'simulat'"),
    ("bench-alone", lambda t: ["bench"], "name one of manager, transfer, disk, remote"),
]
CUDA_CASES: list[Case] = [
    ("run-device-cuda", lambda t: ["run", "--device", "cuda"], "CUDA is not available"),
    ("transfer-device-cuda", lambda t: ["bench", "transfer", "--device", "cuda"], "CUDA is not"),
]


def _kvtier(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse's own errors
        return int(e.code or 0)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory with a file and an empty trace to point at."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "empty.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _check_one_line(argv: list[str], words: str, capsys: pytest.CaptureFixture[str]) -> str:
    status = _kvtier(argv)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert words in lines[0]
    assert lines[0].startswith("kvtier")
    return lines[0]


@pytest.mark.parametrize(("argv", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_mistake_is_one_line_and_exit_2(
    workdir: Path,
    argv: Callable[[Path], list[str]],
    words: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _check_one_line(argv(workdir), words, capsys)
    # Nothing was started: no results, no temporary directories left in the work dir.
    results = workdir / "kvtier-results"
    left = {p.name for p in workdir.iterdir()} - {"a-file", "empty.jsonl", results.name}
    assert left == set()
    assert not results.exists() or list(results.iterdir()) == []


@pytest.mark.skipif(_cuda_available(), reason="this machine has CUDA: --device cuda is valid")
@pytest.mark.parametrize(
    ("argv", "words"), [c[1:] for c in CUDA_CASES], ids=[c[0] for c in CUDA_CASES]
)
def test_cuda_without_cuda_is_one_line_and_exit_2(
    workdir: Path,
    argv: Callable[[Path], list[str]],
    words: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _check_one_line(argv(workdir), words, capsys)


def test_run_checks_before_it_builds_the_model(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Options that need no torch are refused before the slow start (nothing printed)."""
    _check_one_line(["run", "--cpu-bytes", "1TiB"], "lower --cpu-bytes", capsys)
    assert capsys.readouterr().out == ""


def test_simulate_empty_trace_is_an_error_not_zeros(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace of blank lines is as empty as an empty file."""
    trace = workdir / "blank.jsonl"
    trace.write_text("\n\n")
    _check_one_line(["simulate", "--trace", str(trace)], "no requests", capsys)


def test_a_good_trace_in_the_same_directory_works(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cases above fail for their reason, not for the working directory."""
    trace = workdir / "t.jsonl"
    write_mooncake(generate(WorkloadConfig(seed=1, requests=50)), trace)
    assert _kvtier(["simulate", "--trace", str(trace), "--no-belady", "--no-progress"]) == 0
    out = capsys.readouterr().out
    (written,) = (workdir / "kvtier-results").glob("simulate-*.json")
    assert out.splitlines()[-1] == f"wrote {Path('kvtier-results') / written.name}"


def test_help_says_what_kvtier_is(capsys: pytest.CaptureFixture[str]) -> None:
    assert _kvtier(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Tiered KV-cache offloading" in out and "kvtier run" in out
    for command in ("run", "simulate", "bench"):
        assert f"    {command}" in out


@pytest.mark.parametrize("bench", ["disk", "remote", "transfer", "manager"])
def test_bench_options_have_help_and_defaults(
    bench: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _kvtier(["bench", bench, "--help"]) == 0
    parser = cli.build_parser(["bench", bench])
    sub = parser._subparsers._group_actions[0].choices["bench"]  # type: ignore[union-attr]
    leaf = sub._subparsers._group_actions[0].choices[bench]
    for action in leaf._actions:
        if action.option_strings and action.dest != "help":
            assert action.help, f"{bench} {action.option_strings} has no help"
    out = capsys.readouterr().out
    assert "(default: 5)" in out
