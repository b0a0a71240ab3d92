"""`shardprep verify --load`: every sample loaded through the dataset's `dataset.yaml`, as energon does.

The loading is energon's (`cookers.energon_lint`), so it runs in a child process started by module
name: `prep` never imports energon or torch, and the command line stays fast without them. The child
prints one JSON object per line (`progress`, `failure`, then `report`, or `error`); this module turns
them into the `Problem`s of a `VerifyReport`, each sample that does not load named by shard, key and
part with its exception.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import prep
from prep.errors import PrepError
from prep.index.dataset import PreparedDataset
from prep.inspect.verify import Problem, VerifyReport

#: The module the child process runs (`python -m`), named as a string: importing it would load energon.
LOAD_MODULE = "cookers.energon_lint"
MISSING_ENERGON = (
    "`verify --load` decodes samples with megatron-energon, which is not installed here:"
    " pip install shardprep[energon]"
)


def _child_command(root: Path, split: str | None, workers: int | None, config: str) -> list[str]:
    command = [sys.executable, "-m", LOAD_MODULE, str(root), "--dataset-config", config]
    if split is not None:
        command += ["--split", split]
    if workers is not None:
        command += ["--num-workers", str(workers)]
    return command


def _child_environment() -> dict[str, str]:
    """This environment, with the folder holding `prep` (and `cookers` beside it) first on the path."""
    here = str(Path(prep.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": here + (os.pathsep + path if path else "")}


def _problem(failure: dict, config: str) -> Problem:
    where = f"{failure['shard']}/{failure['key']}"
    part = failure["part"]
    what = (
        f"sample {failure['key']!r} of split {failure['split']!r} does not load through {config}"
        + (f": part {part!r}" if part is not None else "")
        + f" raises {failure['error_type']}: {failure['message']}"
    )
    fix = (
        "fix the source data and re-write the shard, or drop the sample by adding"
        f" `{failure['shard']}/{failure['key']}` to `exclude` in split.yaml"
    )
    return Problem(where + (f".{part}" if part is not None else ""), what, fix)


def load_samples(
    report: VerifyReport,
    *,
    split: str | None = None,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Load every sample of `split` (default: every split) of `report.root` in a child process and add
    each one that fails to `report.problems`; `report.loaded` counts the samples loaded."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.energon") is None:
        raise PrepError(MISSING_ENERGON)
    if split is not None:
        with PreparedDataset(report.root) as dataset:
            dataset.split_shards(split)  # a PrepError naming the splits there are, before energon's assertion
    report.load = True
    command = _child_command(Path(report.root), split, workers, report.dataset_config)
    with tempfile.TemporaryFile("w+") as errors:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=errors, text=True, env=_child_environment()
        )
        try:
            summary = None
            assert child.stdout is not None
            for line in child.stdout:
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # printed by the dataset's own code (a sample_loader.py), not a message
                if not isinstance(message, dict):
                    continue
                if "progress" in message and progress is not None:
                    progress(message["progress"]["done"], message["progress"]["total"])
                elif "failure" in message:
                    report.problems.append(_problem(message["failure"], report.dataset_config))
                elif "report" in message:
                    summary = message["report"]
                elif "error" in message:
                    raise PrepError(f"{report.root}: samples cannot be loaded: {message['error']}")
            code = child.wait()
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        if summary is None:
            errors.seek(0)
            last = [line for line in errors.read().splitlines() if line.strip()][-1:] or [f"exit code {code}"]
            if "No module named" in last[0]:
                raise PrepError(f"{MISSING_ENERGON} ({last[0].strip()})")
            raise PrepError(f"loading the samples of {report.root} failed: {last[0].strip()}")
    report.loaded = summary["samples"]
