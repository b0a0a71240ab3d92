"""`write --resume`: a write killed or failed midway keeps the blocks and shards it finished (beside
OUT_DIR); a rerun with the same arguments reuses them, says how many shards, and writes exactly what a
clean run writes; what changed since is redone, and the checkpoint is gone once the dataset is in place."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.index.checkpoint import RESUME_DIR
from prep.write import BadInputError, open_sources, write_dataset
from prep.write.run import WriteProgress
from tests.support.prepare import REPO, run_shardprep
from tests.support.write import rows_file, written

#: A write of `stopped_at_a_missing_image`'s rows: `n` as text, `img` as a media file named by path.
MEDIA_OPTIONS = {"parts": ["n=txt", "img=jpg"], "num_workers": 1, "maxcount": 5}


def stopped_at_a_missing_image(tmp_path: Path, images: dict[int, str]) -> Path:
    """`tmp_path/in.jsonl`, 30 rows of which row i names the image file `images[i]` (below `tmp_path`),
    written to `tmp_path/out` with --resume until an image that is not there stops it; the JSONL."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"n": i, "img": images.get(i)}) + "\n" for i in range(30)))
    with pytest.raises(PrepError, match="missing media file"):
        write_dataset(open_sources([source]), tmp_path / "out", resume=True, **MEDIA_OPTIONS)
    return source


def reused(stdout: str) -> tuple[int, int]:
    """(reused, total) from the summary line of a resumed write."""
    line = next(line for line in stdout.splitlines() if line.startswith("Resumed:"))
    words = line.split()
    return int(words[2].replace(",", "")), int(words[4].replace(",", ""))


FLAGS = ["--maxcount", "10", "--split-ratio", "8,1,1", "--no-progress", "--num-workers", "1"]


def test_a_killed_write_resumes_with_the_shards_it_finished(tmp_path: Path) -> None:
    rows = rows_file(tmp_path / "rows.jsonl", 10_000)
    out = tmp_path / "out"
    command = [sys.executable, "-m", "prep", "write", str(rows), str(out), *FLAGS, "--resume"]
    run = subprocess.Popen(command, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    checkpoint = out / RESUME_DIR
    deadline = time.monotonic() + 60
    while run.poll() is None and time.monotonic() < deadline:
        # a shard's files are kept before its record: 31 of them mean at least 30 shards kept whole
        if checkpoint.is_dir() and sum(name.endswith(".tar.idx") for name in os.listdir(checkpoint)) > 30:
            os.kill(run.pid, signal.SIGKILL)
            break
        time.sleep(0.005)
    assert run.wait() == -signal.SIGKILL, "the write ended before it could be killed midway"
    assert not (out / ".nv-meta").exists()

    result = run_shardprep("write", str(rows), str(out), *FLAGS, "--resume", check=True)
    count, total = reused(result.stdout)
    run_shardprep("write", str(rows), str(tmp_path / "clean"), *FLAGS, check=True)
    assert written(out) == written(tmp_path / "clean")
    assert total == len(list((tmp_path / "clean").rglob("*.tar"))) and 30 <= count < total
    assert not checkpoint.exists(), "the checkpoint outlived the dataset it was for"


def failed_write(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A write with --resume of two files that fails on a bad line of the second: the first one's
    block is kept. Returns the two files and OUT_DIR."""
    good = rows_file(tmp_path / "a.jsonl", 300)
    bad = rows_file(tmp_path / "b.jsonl", 300)
    bad.write_text(bad.read_text().replace('{"n": 250,', '{"n": 250', 1))
    out = tmp_path / "out"
    with pytest.raises(BadInputError, match="b.jsonl:251"):
        write_dataset(open_sources([good, bad]), out, maxcount=20, resume=True)
    assert (out / RESUME_DIR).is_dir() and not (out / ".nv-meta").exists()
    return good, bad, out


def test_a_failed_write_resumes_and_an_input_changed_since_is_redone(tmp_path: Path) -> None:
    good, bad, out = failed_write(tmp_path)
    with pytest.raises(PrepError, match="rerun that write with --resume"):
        write_dataset(open_sources([good]), out, maxcount=20)

    rows_file(bad, 300, text="changed")  # fixed, and different: nothing of it may be reused
    summary = write_dataset(open_sources([good, bad]), out, maxcount=20, resume=True)
    clean = write_dataset(open_sources([good, bad]), tmp_path / "clean", maxcount=20)
    assert written(out) == written(tmp_path / "clean") and summary.samples == clean.samples == 600
    assert summary.resumed == (0, 30, 1, 2), "the first file's block, and no shard (none was cut yet)"
    assert not (out / RESUME_DIR).exists()


def stop_after_the_last_shard(progress: WriteProgress) -> None:
    """A progress callback that interrupts the write once every shard is written and kept."""
    if progress.stage == "writing shards" and progress.done == progress.total > 0:
        raise KeyboardInterrupt


def test_a_ray_rerun_that_reuses_every_block_and_shard_reaches_no_ray(tmp_path: Path) -> None:
    """Nothing left to count, encode or assemble, nothing to send: no local Ray instance is started
    (5-15 s) and no cluster reached (here an address nothing answers, which reaching would refuse)."""
    pytest.importorskip("ray", reason="Ray is not installed (pip install shardprep[ray])")
    source, out = rows_file(tmp_path / "a.jsonl", 300), tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        write_dataset(
            open_sources([source]), out, maxcount=20, resume=True, progress=stop_after_the_last_shard
        )
    summary = write_dataset(
        open_sources([source]), out, maxcount=20, resume=True, engine="ray", ray_address="127.0.0.1:1"
    )
    assert summary.resumed == (15, 15, 1, 1) and not (out / RESUME_DIR).exists()


def test_options_that_change_the_output_are_not_resumed_across(tmp_path: Path) -> None:
    good, bad, out = failed_write(tmp_path)
    rows_file(bad, 300)
    summary = write_dataset(open_sources([good, bad]), out, maxcount=25, resume=True)
    assert summary.resumed == (0, 24, 0, 2)
    clean = tmp_path / "clean"
    write_dataset(open_sources([good, bad]), clean, maxcount=25)
    assert written(out) == written(clean)


def test_what_cannot_be_written_in_blocks_is_refused_with_resume(tmp_path: Path) -> None:
    rows = rows_file(tmp_path / "rows.jsonl", 20)
    with pytest.raises(PrepError, match="--resume cannot write this: --group-contiguous"):
        write_dataset(
            open_sources([rows]), tmp_path / "out", resume=True, group_by="n", group_contiguous=True
        )


def test_a_media_file_changed_since_is_read_again(tmp_path: Path, monkeypatch) -> None:
    """A part given as a path reads that file: a block whose media file changed is encoded again, and
    so is every shard made from it, though the JSONL itself is unchanged."""
    from prep.write import blockwise

    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 64)
    (tmp_path / "img0.jpg").write_bytes(b"OLD-IMAGE")
    source = stopped_at_a_missing_image(tmp_path, {0: "img0.jpg", 20: "missing.jpg"})
    options = MEDIA_OPTIONS
    (tmp_path / "missing.jpg").write_bytes(b"NOW-THERE")
    (tmp_path / "img0.jpg").write_bytes(b"NEW-IMAGE-BYTES")
    resumed = write_dataset(open_sources([source]), tmp_path / "out", resume=True, **options)
    assert resumed.resumed is not None and resumed.resumed[2] > 0  # some blocks were reused
    write_dataset(open_sources([source]), tmp_path / "clean", **options)
    assert written(tmp_path / "out") == written(tmp_path / "clean")


def test_pieces_reused_are_left_out_of_the_stage_eta(tmp_path: Path, monkeypatch) -> None:
    """Blocks an earlier run encoded come back at once: they count as done, but a pace taken from them
    would promise the rest as quickly, so until a block is worked on here the stage has no ETA."""
    from prep.write import blockwise

    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 64)
    source = stopped_at_a_missing_image(tmp_path, {29: "late.jpg"})
    options = MEDIA_OPTIONS
    (tmp_path / "late.jpg").write_bytes(b"LATE")
    seen = []
    resumed = write_dataset(
        open_sources([source]), tmp_path / "out", resume=True, progress=seen.append, **options
    )
    assert resumed.resumed is not None and resumed.resumed[2] == resumed.resumed[3] - 1  # all but the last
    encoding = [state for state in seen if state.stage == "encoding blocks" and state.done]
    assert len(encoding) > 3 and all(state.eta is None for state in encoding)
    shards = [state for state in seen if state.stage == "writing shards" and 0 < state.done < state.total]
    assert shards and all(state.eta is not None for state in shards)  # worked on here: a pace, an ETA


def test_samples_of_reused_blocks_are_left_out_of_the_rate(tmp_path: Path) -> None:
    """A resumed write takes the blocks an earlier run encoded at once: the samples/s and MB/s its
    progress line shows count only what this run encoded, or a rerun that reuses nearly everything would
    show a rate the input never went at."""
    from prep.write.cli import _progress_text

    good, bad, out = failed_write(tmp_path)
    rows_file(bad, 300)
    seen = []
    summary = write_dataset(open_sources([good, bad]), out, maxcount=20, resume=True, progress=seen.append)
    assert summary.resumed == (0, 30, 1, 2)  # a.jsonl's 300 samples were encoded by the failed run
    last = seen[-1]
    fresh = (last.samples - 300) / last.seconds
    assert last.samples == 600 and f"({fresh:,.0f} samples/s" in _progress_text(last)


def test_an_interrupted_overwrite_is_resumed_with_overwrite_not_called_finished(tmp_path: Path) -> None:
    """A write with --overwrite --resume that stops leaves the dataset it was replacing in place, beside
    its checkpoint; a rerun without --overwrite is refused, and must say to add it, not that the write
    finished and its checkpoint can go."""
    good = rows_file(tmp_path / "a.jsonl", 300)
    bad = rows_file(tmp_path / "b.jsonl", 300)
    out = tmp_path / "out"
    write_dataset(open_sources([good]), out, maxcount=50)  # the dataset being replaced
    bad.write_text(bad.read_text().replace('{"n": 250,', '{"n": 250', 1))
    with pytest.raises(BadInputError, match="b.jsonl:251"):
        write_dataset(open_sources([good, bad]), out, maxcount=20, resume=True, overwrite=True)
    rows_file(bad, 300)
    with pytest.raises(PrepError, match="rerun that write with --resume --overwrite") as refused:
        write_dataset(open_sources([good, bad]), out, maxcount=20, resume=True)
    assert "finished" not in str(refused.value) and (out / RESUME_DIR).is_dir()

    summary = write_dataset(open_sources([good, bad]), out, maxcount=20, resume=True, overwrite=True)
    assert summary.resumed == (0, 30, 1, 2)
    write_dataset(open_sources([good, bad]), tmp_path / "clean", maxcount=20)
    assert written(out) == written(tmp_path / "clean")
