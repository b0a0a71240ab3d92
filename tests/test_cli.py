"""The `shardprep` command line: fast to start, and the kit every command shares."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.prepare import REPO, run_shardprep


def test_command_line_imports_neither_torch_nor_energon() -> None:
    code = (
        "import sys, prep.cli, prep.prepare, prep.prepare.cli, prep.write.cli, prep.inspect.cli, prep.mount.cli;"
        "from prep.cli import main;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert result.returncode == 0


def test_help_lists_prepare() -> None:
    result = run_shardprep("--help")
    assert result.returncode == 0 and "prepare" in result.stdout


def test_the_entry_point_module_runs_as_a_script_too(tmp_path) -> None:
    """`python -m prep.cli` (the module pyproject's `shardprep` script names) runs the command line, as
    `python -m prep` does, instead of exiting silently having done nothing."""
    listed = subprocess.run(
        [sys.executable, "-m", "prep.cli", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert listed.returncode == 0 and "prepare" in listed.stdout
    failed = subprocess.run(
        [sys.executable, "-m", "prep.cli", "prepare", str(tmp_path / "missing"), "--non-interactive"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert failed.returncode == 1 and "does not exist" in failed.stderr, failed.stderr


def run_on_a_terminal(*args: str) -> str:
    """`python -m prep ARGS` with its output on a pseudo-terminal, as a user at a terminal sees it."""
    import pty

    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "prep", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the process has exited
            break
        if not chunk:
            break
        output += chunk
    os.close(controller)
    assert process.wait(timeout=120) == 0, output.decode(errors="replace")
    return output.decode(errors="replace")


def test_prepare_and_write_show_progress_on_a_terminal_unless_told_not_to(tmp_path) -> None:
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"text": "row {i}"}}\n' for i in range(3000)))
    written = run_on_a_terminal("write", str(rows), str(tmp_path / "out"), "--maxcount", "1000")
    assert "written 3,000 samples" in written and "\r" in written
    prepare = [
        "prepare",
        str(tmp_path / "out"),
        "--non-interactive",
        "--split-ratio",
        "1,0,0",
        "--force-overwrite",
    ]
    assert "Indexing 3/3 shards" in run_on_a_terminal(*prepare)
    quiet = run_on_a_terminal(*prepare, "--no-progress")
    assert "Indexing " not in quiet and "Done: indexed 3000 samples in 3 shards" in quiet
    piped = run_shardprep(*prepare, check=True)
    assert "Indexing " not in piped.stdout + piped.stderr  # not a terminal: no progress line


def test_tmp_path_help_says_what_each_command_keeps_there() -> None:
    """info, verify and preview download a bucket dataset's index under --tmp-path; nothing is uploaded."""
    for command in ("info", "verify", "preview", "prepare", "write"):
        result = run_shardprep(command, "--help", check=True)
        assert "info, verify and preview download the index there" in " ".join(result.stdout.split()), command


def test_write_names_its_arguments_as_its_help_and_the_readme_do() -> None:
    """`shardprep write SOURCE... OUT_DIR`: the usage line and the missing-argument error say so."""
    usage = run_shardprep("write", "--help", check=True)
    assert "Usage: shardprep write [OPTIONS] SOURCE... OUT_DIR" in usage.stdout
    missing = run_shardprep("write")
    assert missing.returncode == 2 and "Missing argument 'SOURCE... OUT_DIR'" in missing.stderr


def test_every_option_of_every_command_says_what_it_does() -> None:
    """An option with no help text leaves its --help line a bare choice list (--on-error, --aux-format)."""
    from prep.cli import COMMANDS, cli

    for name in COMMANDS:
        command = cli.get_command(None, name)  # type: ignore[arg-type]
        for option in command.params:
            if option.param_type_name == "option":
                assert option.help, f"shardprep {name} {option.opts[0]} has no help text"


def test_write_help_says_what_goes_over_maxcount_and_maxsize() -> None:
    """A sample bigger than --maxsize, and a --group-contiguous group over either limit, get a shard each."""
    result = run_shardprep("write", "--help", check=True)
    text = " ".join(result.stdout.split())
    assert (
        "Samples per shard at most (but for a --group-contiguous group larger than this: a shard of its own)"
        in text
    )
    assert (
        "Bytes per shard at most (but for one sample, or a --group-contiguous group, larger than this" in text
    )
