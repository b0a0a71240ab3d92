"""`write --engine ray` on a real local Ray instance of 2 CPUs (started and stopped by this module): a
plain JSONL file's shards written as Ray tasks, and JSONL, CSV and Parquet files with options written in
blocks, are byte for byte those one process writes; the first bad record in input order stops the run,
named as one process names it, and leaves nothing behind; what Ray cannot write byte for byte is refused."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from prep.engines.ray_cluster import _descendants
from prep.errors import PrepError
from prep.write import BadInputError, blockwise, open_sources, write_dataset
from prep.write.sources.jsonl import JsonlSource
from tests.support.prepare import run_shardprep, snapshot
from tests.support.ray import local_ray
from tests.support.write import rows_file, written


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local Ray instance with 2 CPUs, shut down after the module's tests; yields its address."""
    for ray in local_ray(tmp_path_factory):
        yield ray.get_runtime_context().gcs_address


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


def test_what_ray_cannot_write_byte_for_byte_is_refused_by_name(cluster: str, tmp_path: Path) -> None:
    rows = rows_file(tmp_path / "rows.jsonl", 20)
    refused = {
        "--group-contiguous": {"group_by": "n", "group_contiguous": True},
        "--on-error skip": {"on_error": "skip"},
    }
    for option, options in refused.items():
        with pytest.raises(PrepError, match=f"--engine ray cannot write this: {option}"):
            write_dataset(JsonlSource(rows), tmp_path / "out", engine="ray", **options)
    with pytest.raises(PrepError, match="is not a JSONL, CSV or Parquet file"):
        write_dataset([{"txt": "a"}], tmp_path / "out", engine="ray")
    assert not (tmp_path / "out").exists()


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few kB (rows), so that small inputs are read as many blocks."""
    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 3000)
    monkeypatch.setattr(blockwise, "BLOCK_ROWS", 37)


def records(count: int) -> list[dict]:
    return [
        {"id": f"k{n}", "user": f"u{n % 13}", "text": "word " * (n * 7919 % 97), "n": n} for n in range(count)
    ]


def csv_file(path: Path, rows: list[dict], stray_quote_at: int | None = None) -> Path:
    """CSV with CRLF line ends, quoted newlines in every 17th row, a lone CR in every 5th, and a literal
    quote in an unquoted field at `stray_quote_at` (which flips the quote count the cutter goes by)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(list(rows[0]))
    for number, row in enumerate(rows):
        text = row["text"] + ('\nsecond line, "quoted"' if number % 17 == 0 else "")
        text += "\rafter a lone CR" if number % 5 == 0 else ""
        if number == stray_quote_at:
            out.write(f'{row["id"]},{row["user"]},he said "hi,{row["n"]}\r\n')
            continue
        writer.writerow([row["id"], row["user"], text, row["n"]])
    path.write_text(out.getvalue(), newline="")
    return path


def inputs(folder: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = records(400)
    jsonl = folder / "in.jsonl"
    jsonl.write_text(
        "".join(json.dumps(row) + ("\n\n" if n % 50 == 0 else "\n") for n, row in enumerate(rows))
    )
    pq.write_table(pa.Table.from_pylist(rows), folder / "in.parquet", row_group_size=120)
    return {
        "csv": csv_file(folder / "in.csv", rows, stray_quote_at=40),
        "jsonl": jsonl,
        "parquet": folder / "in.parquet",
    }


CASES = [
    ("csv", {}),
    ("csv", {"split_ratio": "8,1,1", "maxcount": 20}),
    ("parquet", {"parts": ["text=txt", "n=json"], "key_column": "id", "maxsize": 20000}),
    (
        "jsonl",
        {
            "split_ratio": "6,2,2",
            "group_by": "user",
            "maxcount": 30,
            "sample_type": "TextSample",
            "field_map": '{"text": "json"}',
        },
    ),
]


@pytest.mark.usefixtures("small_blocks")
def test_ray_writes_csv_parquet_and_jsonl_with_options_as_one_process_does(
    cluster: str, tmp_path: Path
) -> None:
    pytest.importorskip("pyarrow", reason="Parquet needs pyarrow")
    files = inputs(tmp_path)
    for kind, options in CASES:
        ours, theirs = tmp_path / f"ray-{kind}", tmp_path / f"one-{kind}"
        summary = write_dataset(open_sources([files[kind]]), ours, engine="ray", **options)
        write_dataset(open_sources([files[kind]]), theirs, num_workers=1, **options)
        assert summary.samples == 400
        assert written(ours) == written(theirs), (kind, options)
        shutil.rmtree(ours), shutil.rmtree(theirs)


@pytest.mark.usefixtures("small_blocks")
def test_several_inputs_number_their_keys_on_across_files(cluster: str, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow", reason="Parquet needs pyarrow")
    files = inputs(tmp_path)
    sources = [files["jsonl"], files["csv"], files["jsonl"]]
    write_dataset(open_sources(sources), tmp_path / "ray", engine="ray", maxcount=50)
    write_dataset(open_sources(sources), tmp_path / "one", num_workers=1, maxcount=50)
    assert written(tmp_path / "ray") == written(tmp_path / "one")


@pytest.mark.usefixtures("small_blocks")
def test_the_first_bad_row_in_input_order_is_named_and_nothing_is_left(cluster: str, tmp_path: Path) -> None:
    rows = records(300)
    path = csv_file(tmp_path / "in.csv", rows)
    lines = path.read_bytes().split(b"\r\n")
    bad_line = next(n for n in range(250, 300) if lines[n].count(b",") == 3 and b'"' not in lines[n])
    lines[bad_line] += b",extra"
    path.write_bytes(b"\r\n".join(lines))
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(out)
    with pytest.raises(BadInputError) as raised:
        write_dataset(open_sources([path]), out, engine="ray")
    with pytest.raises(BadInputError) as expected:
        write_dataset(open_sources([path]), tmp_path / "one", num_workers=1)
    assert str(raised.value) == str(expected.value)  # the same file:line (quoted newlines and lone CRs count)
    assert "the row has 5 fields, the header has 4" in str(raised.value)
    assert snapshot(out) == before


def test_a_bad_row_is_named_before_bad_utf8_in_a_later_block_of_its_ray_task(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks go to Ray several to a task: a byte that is not UTF-8 in a later block of the task (an
    error the block raises) must not be named before a bad row of an earlier block (one it reports)."""
    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 1 << 14)  # 26 blocks: 3 to a Ray task
    lines = ["id,text", *(f"{n},{'t' * 200}" for n in range(2000))]
    lines[3] = "2,b,extra"
    data = bytearray("\n".join(lines).encode() + b"\n")
    data[20_000] = 0xFF  # in the second block
    path = tmp_path / "in.csv"
    path.write_bytes(bytes(data))
    with pytest.raises(BadInputError) as raised:
        write_dataset(open_sources([path]), tmp_path / "out", engine="ray")
    with pytest.raises(BadInputError) as expected:
        write_dataset(open_sources([path]), tmp_path / "one", num_workers=1)
    assert str(raised.value) == str(expected.value) and "in.csv:4: the row has 3 fields" in str(raised.value)


@pytest.mark.usefixtures("small_blocks")
def test_a_key_repeated_in_a_later_block_is_named(cluster: str, tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="Parquet needs pyarrow")
    import pyarrow.parquet as pq

    rows = records(300)
    rows[250]["id"] = rows[3]["id"]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet", row_group_size=100)
    with pytest.raises(BadInputError, match=r"in.parquet:row 251: duplicate sample key 'k3'"):
        write_dataset(
            open_sources([tmp_path / "in.parquet"]), tmp_path / "out", engine="ray", key_column="id"
        )
    assert not (tmp_path / "out").exists()


def kill_a_ray_task_process(stop: threading.Event, killed: list[int]) -> None:
    """Until `stop`: SIGKILL the first process of this test's Ray instance (a descendant of this
    process) found running a task."""
    while not stop.is_set() and not killed:
        for pid in _descendants(os.getpid()):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if command.startswith(b"ray::_run_chunk"):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
        time.sleep(0.001)


def test_a_ray_worker_killed_mid_write_is_retried_and_the_output_is_the_same(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 20_000)
    path = csv_file(tmp_path / "in.csv", records(4000))
    write_dataset(open_sources([path]), tmp_path / "one", num_workers=1, maxcount=100)
    for attempt in range(3):  # the killer may miss every short task of a run: try again
        out = tmp_path / f"ray-{attempt}"
        stop, killed = threading.Event(), []
        killer = threading.Thread(target=kill_a_ray_task_process, args=(stop, killed))
        killer.start()
        try:
            write_dataset(open_sources([path]), out, engine="ray", maxcount=100)
        finally:
            stop.set()
            killer.join()
        assert written(out) == written(tmp_path / "one")
        if killed and "a Ray worker died" in capfd.readouterr().err:  # a retry, announced
            return
    pytest.fail("no Ray task was killed while it ran (so none retried): the test proved nothing")


def test_ray_resumes_what_a_local_run_finished(cluster: str, tmp_path: Path) -> None:
    from tests.write.test_resume import failed_write

    good, bad, out = failed_write(tmp_path)  # on this machine, with --resume
    rows_file(bad, 300)
    summary = write_dataset(open_sources([good, bad]), out, maxcount=20, resume=True, engine="ray")
    assert summary.resumed == (0, 30, 1, 2)
    write_dataset(open_sources([good, bad]), tmp_path / "one", maxcount=20)
    assert written(out) == written(tmp_path / "one")
