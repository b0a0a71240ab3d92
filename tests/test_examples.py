"""The runnable examples under examples/ run from a fresh state, print what their READMEs say, and leave
nothing behind in the temporary folder unless told to keep their outputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    "scale/run.py": [
        "Done: indexed 120 samples in 6 shards",
        "healthy",
        "300 samples loaded from msc://example/",
    ],
}


class Run:
    """One example run in the background, in a temporary folder of its own."""

    def __init__(self, script: str, temporary: Path, *arguments: str) -> None:
        self.temporary = temporary
        temporary.mkdir(parents=True)
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "examples" / script), *arguments],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(temporary)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )

    def finish(self) -> tuple[int, str, str]:
        try:
            stdout, stderr = self.process.communicate(timeout=600)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.communicate()
        return self.process.returncode, stdout, stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, str, Path]]:
    """Every example run at once (each mostly waits on its imports, one CPU at a time), and the demo once
    more with `--out`: their exit codes, output and temporary folders, by script."""
    root = tmp_path_factory.mktemp("examples")
    (root / "kept").mkdir()
    started = {script: Run(script, root / script.replace("/", "-")) for script in EXAMPLES}
    started["demo --out"] = Run("demo/demo.py", root / "demo-out", "--out", str(root / "kept" / "captions"))
    finished = {}
    for script, run in started.items():
        finished[script] = (*run.finish(), run.temporary)
    finished["kept"] = (0, "", "", root / "kept")
    return finished


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_runs_prints_what_its_readme_says_and_leaves_no_temporary_files(runs, example):
    returncode, stdout, stderr, temporary = runs[example]
    assert returncode == 0, stderr[-3000:]
    for line in EXAMPLES[example]:
        assert line in stdout, (line, stdout[-3000:])
    assert ": False" not in stdout
    left = [path.name for path in temporary.iterdir() if not path.name.startswith("torchinductor_")]
    assert left == [], "the example left these in the temporary folder"  # torch's compile cache is torch's


def test_the_demo_keeps_its_dataset_where_out_says(runs):
    returncode, _, stderr, _ = runs["demo --out"]
    assert returncode == 0, stderr[-3000:]
    assert (runs["kept"][3] / "captions" / ".nv-meta" / ".info.json").is_file()


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
