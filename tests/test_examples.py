"""The runnable examples under examples/ run from a fresh state, print what their READMEs say, and leave
nothing behind in the temporary folder unless told to keep their outputs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.prepare import REPO

#: Each example and lines of what its README says it prints.
EXAMPLES = {
    "demo/demo.py": [
        "3. Loading through energon's get_train_dataset + get_loader",
        "batch 2: keys=",
        "Done.",
    ],
    "write/run.py": ["3. The same folder, polylithic", "24 joined samples loaded"],
    "inspect/inspect_dataset.py": [
        "$ shardprep verify",
        "healthy",
        "$ shardprep preview",
        "$ shardprep umount",
    ],
    "packing/run.py": ["batch 0: input_ids (1, 2048)", "cu_seq_lens_q", "fill"],
    "records/run.py": ["the same examples as assemble_stream over the loader's records: True", "best-fit"],
    "rollouts/run.py": ["first batch: input_ids (1, 4096)", "BlockMask", "saved"],
    "translation/run.py": ["padding by bucket width", "alignment", "dropped:"],
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_runs_prints_what_its_readme_says_and_leaves_no_temporary_files(tmp_path, example):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / example)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(temporary)},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for line in EXAMPLES[example]:
        assert line in result.stdout, (line, result.stdout[-3000:])
    assert ": False" not in result.stdout
    left = [path.name for path in temporary.iterdir() if not path.name.startswith("torchinductor_")]
    assert left == [], "the example left these in the temporary folder"  # torch's compile cache is torch's


def test_the_demo_keeps_its_dataset_where_out_says(tmp_path):
    out = tmp_path / "captions"
    subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo" / "demo.py"), "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        check=True,
        timeout=600,
    )
    assert (out / ".nv-meta" / ".info.json").is_file()


def test_the_demo_never_replaces_a_folder_given_as_out(tmp_path):
    """`--out` names where the demo's dataset goes; a folder holding anything is refused, not removed."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "demo" / "demo.py"), "--out", str(tmp_path / "mine")],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 2 and "is not empty" in result.stderr
    assert [path.name for path in (tmp_path / "mine").iterdir()] == ["notes.txt"]


def test_the_inspect_example_answers_help_with_its_usage_and_runs_nothing(tmp_path):
    """`--help` was a dataset path to it, and it ran every command on that (the other examples parse their
    arguments with argparse from the start)."""
    result = subprocess.run(
        [sys.executable, str(REPO / "examples" / "inspect" / "inspect_dataset.py"), "--help"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.startswith("usage: "), result.stdout + result.stderr
    assert "$ shardprep" not in result.stdout
