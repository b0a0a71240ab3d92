"""`write --engine ray` on a real local Ray instance of 2 CPUs (started and stopped by this module): a
plain JSONL file's shards written as Ray tasks are byte for byte those one process writes; a bad line
stops the run naming `file:line` and leaves nothing behind; an input Ray does not write yet is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.write import BadInputError, write_dataset
from prep.write.sources.jsonl import JsonlSource
from tests.support.prepare import run_shardprep, snapshot
from tests.support.ray import local_ray


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local Ray instance with 2 CPUs, shut down after the module's tests; yields its address."""
    for ray in local_ray(tmp_path_factory):
        yield ray.get_runtime_context().gcs_address


def rows_file(path: Path, count: int) -> Path:
    lines = [json.dumps({"n": number, "text": "word " * (number % 7)}) for number in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return path


def written(out: Path) -> dict[str, bytes]:
    """Every file of the dataset but the random index.uuid, by path."""
    return {
        str(path.relative_to(out)): path.read_bytes()
        for path in sorted(out.rglob("*"))
        if path.is_file() and path.name != "index.uuid"
    }


def test_ray_writes_the_bytes_one_process_writes(cluster: str, tmp_path: Path) -> None:
    rows = rows_file(tmp_path / "rows.jsonl", 203)
    flags = ("--maxcount", "10", "--no-progress")
    run_shardprep(
        "write",
        str(rows),
        str(tmp_path / "ray"),
        *flags,
        "--engine",
        "ray",
        "--ray-address",
        cluster,
        check=True,
    )
    run_shardprep("write", str(rows), str(tmp_path / "one"), *flags, "--num-workers", "1", check=True)
    ours, theirs = written(tmp_path / "ray"), written(tmp_path / "one")
    assert len([name for name in ours if name.endswith(".tar")]) == 21
    assert ours == theirs


def test_a_bad_line_is_named_and_nothing_is_left(cluster: str, tmp_path: Path) -> None:
    rows = rows_file(tmp_path / "rows.jsonl", 100)
    rows.write_text(rows.read_text().replace('{"n": 57,', '{"n": 57', 1))
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(out)
    with pytest.raises(BadInputError, match="rows.jsonl:58"):
        write_dataset(JsonlSource(rows), out, maxcount=10, engine="ray")
    assert snapshot(out) == before


def test_an_input_ray_does_not_write_yet_is_refused(cluster: str, tmp_path: Path) -> None:
    rows = rows_file(tmp_path / "rows.jsonl", 20)
    with pytest.raises(PrepError, match="--engine ray writes one plain JSONL file so far"):
        write_dataset(JsonlSource(rows), tmp_path / "out", split_ratio="8,1,1", engine="ray")
    assert not (tmp_path / "out" / ".nv-meta").exists()
