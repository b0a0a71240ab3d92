"""`shardprep write ... s3://bucket/out`: the dataset a local write makes, uploaded shards first and
`.info.json` last; energon reads it through `msc://`; a non-empty prefix is refused without --overwrite."""

from __future__ import annotations

import json

import pytest

from prep.storage.address import parse_address
from prep.storage.store import open_store
from prep.write.options import WriteOptions
from prep.write.remote import write_remote
from prep.write.sources.jsonl import JsonlSource
from tests.support.prepare import run_shardprep, sqlite_contents, tar_indexes
from tests.support.s3 import S3Server

ROWS = [{"id": i, "text": f"line {i} " + "x" * (i * 37 % 500)} for i in range(300)]


def files(root):
    return {
        str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name not in ("index.sqlite", "index.uuid")
    }


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    return path


def test_bucket_write_uploads_what_a_local_write_writes(s3, source, tmp_path, monkeypatch):
    s3.make_bucket("written")
    args = ["--maxcount", "40", "--split-ratio", "8,1,1", "--part", "text=txt", "--no-progress"]
    result = run_shardprep("write", str(source), "s3://written/out", *args, "--tmp-path", str(tmp_path / "t"))
    assert result.returncode == 0, result.stderr
    assert "s3://written/out" in result.stdout and "Wrote 300 samples" in result.stdout
    assert not list((tmp_path / "t").iterdir())
    fetched = tmp_path / "fetched"
    s3.download_prefix("written", "out", fetched)
    local = tmp_path / "local"
    run_shardprep("write", str(source), str(local), *args, check=True)
    assert files(fetched) == files(local)
    assert tar_indexes(fetched) == tar_indexes(local)
    assert sqlite_contents(fetched / ".nv-meta" / "index.sqlite") == sqlite_contents(
        local / ".nv-meta" / "index.sqlite"
    )
    pytest.importorskip("megatron.energon")
    from tests.support.write import load_parts

    monkeypatch.setenv("MSC_CONFIG", str(s3.msc_config(tmp_path / "msc.yaml", "wrote", "written")))
    assert load_parts("msc://wrote/out") == load_parts(local)  # type: ignore[arg-type]


def test_big_shards_go_up_in_parts_and_a_full_prefix_needs_overwrite(s3, tmp_path):
    s3.make_bucket("parted")
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": "y" * 100_000, "i": i}) + "\n" for i in range(70)))
    store = open_store(parse_address("s3://parted/out"), part_size=5 << 20, multipart_threshold=6 << 20)
    options = WriteOptions.parse(parts=["text=txt"], maxcount=1000)
    summary = write_remote([JsonlSource(path)], "s3://parted/out", options, store=store)
    assert summary.samples == 70 and str(summary.dataset) == "s3://parted/out"
    shard = next(key for key in s3.keys("parted") if key.endswith(".tar"))
    assert "-" in s3.client().head_object(Bucket="parted", Key=shard)["ETag"], "not a multipart upload"
    with pytest.raises(Exception, match="is not empty"):
        write_remote([JsonlSource(path)], "s3://parted/out", options, store=store)
    before = s3.keys("parted")
    store.put("stale.txt", b"left from before")
    again = WriteOptions.parse(parts=["text=txt"], maxcount=1000, overwrite=True)
    write_remote([JsonlSource(path)], "s3://parted/out", again, store=store)
    assert s3.keys("parted") == before, "--overwrite leaves only the new dataset"


def test_an_overwrite_deletes_the_old_markers_before_the_files_they_name(s3, tmp_path):
    """A polylithic dataset replaced by a plain one: its `metadataset.yaml` and `.info.json` go before
    any of its media or shards, so a deletion stopped on the way never leaves a marker naming a file
    that is gone (the media folder sorts before `metadataset.yaml`)."""
    s3.make_bucket("replaced")
    for name in ("m1.bin", "m2.bin"):
        (tmp_path / name).write_bytes(name.encode())
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"text": "a", "img": "m1.bin"}\n{"text": "b", "img": "m2.bin"}\n')
    store = open_store(parse_address("s3://replaced/ds"))
    old = WriteOptions.parse(parts=["text=txt"], media_columns=["img=bin"])
    write_remote([JsonlSource(rows)], "s3://replaced/ds", old, store=store, tmp_path=tmp_path / "t")
    deleted: list[str] = []
    store.client.meta.events.register(
        "before-parameter-build.s3.DeleteObject", lambda params, **_: deleted.append(params["Key"])
    )
    new = WriteOptions.parse(parts=["text=txt"], overwrite=True)
    write_remote([JsonlSource(rows)], "s3://replaced/ds", new, store=store, tmp_path=tmp_path / "t")
    assert deleted[:2] == ["ds/metadataset.yaml", "ds/primary/.nv-meta/.info.json"], deleted
    assert not any(key.startswith(("ds/media/", "ds/primary/")) for key in s3.keys("replaced"))


def test_the_time_a_bucket_write_reports_includes_its_upload(s3, source, tmp_path):
    """The summary's "Wrote ... in N s" is the whole run: the upload (minutes for a big dataset) counts."""
    import time

    s3.make_bucket("timed")
    store = open_store(parse_address("s3://timed/out"))
    store.client.meta.events.register("before-parameter-build.s3.PutObject", lambda **_: time.sleep(0.1))
    options = WriteOptions.parse(parts=["text=txt"], maxcount=1000)
    started = time.perf_counter()
    summary = write_remote([JsonlSource(source)], "s3://timed/out", options, store=store, tmp_path=tmp_path)
    # 0.3 s at least: .tar.idx, .nv-meta and .info.json in turn after the write (the shard goes up during it)
    took = time.perf_counter() - started
    assert took > 0.3 and summary.seconds > 0.8 * took, (summary.seconds, took)


def test_an_address_is_read_as_energon_reads_it_and_may_not_climb_above_its_bucket(s3, source):
    """energon's loader drops empty and `.` parts of an address and resolves `..`: the write puts its
    objects where `msc://PROFILE/x/../out//` reads them, not under keys holding `..` or `//`."""
    s3.make_bucket("dotted")
    args = ["--maxcount", "100", "--part", "text=txt", "--no-progress"]
    result = run_shardprep("write", str(source), "s3://dotted/x/../out//", *args)
    assert result.returncode == 0, result.stderr
    assert "s3://dotted/out" in result.stdout
    written = s3.keys("dotted")
    assert written and all(key.startswith("out/") and "//" not in key for key in written), written
    above = run_shardprep("write", str(source), "s3://dotted/../up", *args)
    assert above.returncode != 0 and "s3://dotted/../up climbs above the top of its bucket" in above.stderr
    assert s3.keys("dotted") == written, "a write above the bucket's top wrote something"


def test_a_misspelt_address_is_refused_not_written_as_a_local_folder(s3, source, tmp_path):
    """`S3://b/out` and `s3:/b/out` are local paths as written (energon takes them so too): a write made
    a folder `S3:` in the working directory, and said it wrote `S3:/b/out`."""
    s3.make_bucket("misspelt")
    for address, meant in (
        ("S3://misspelt/out", "s3://misspelt/out"),
        ("s3:/misspelt/out", "s3://misspelt/out"),
    ):
        result = run_shardprep(
            "write", str(source), address, "--part", "text=txt", "--no-progress", cwd=tmp_path
        )
        assert result.returncode == 2, result.stdout
        assert (
            f"{address} is a local path as written, and not there: write the address as {meant}."
            in result.stderr
        )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["rows.jsonl"]
    assert s3.keys("misspelt") == []


def test_a_write_aborts_the_incomplete_uploads_a_killed_run_left_for_its_keys(s3, source, tmp_path):
    """A run killed mid-upload leaves its multipart uploads' parts on the server (billed until aborted);
    the next write to the prefix aborts those of the objects it writes, says so in one line, and leaves
    every other upload alone (another object's, another prefix's)."""
    s3.make_bucket("leftover")
    ours = ["out/shard-000000.tar", "out/.nv-meta/index.sqlite"]
    others = ["out/notes.bin", "out2/shard-000000.tar", "outer.tar"]
    for key in ours + others:
        s3.leave_incomplete_upload("leftover", key)
    args = ["--part", "text=txt", "--maxcount", "1000", "--no-progress", "--tmp-path", str(tmp_path / "t")]
    result = run_shardprep("write", str(source), "s3://leftover/out", *args)
    assert result.returncode == 0, result.stderr
    assert s3.incomplete_uploads("leftover") == sorted(others)
    assert (
        "Aborted 2 incomplete uploads an earlier run left: shard-000000.tar, .nv-meta/index.sqlite"
        in result.stderr.splitlines()
    ), result.stderr


def test_a_shard_goes_up_in_parts_over_an_earlier_runs_incomplete_upload_of_it(s3, tmp_path):
    """The earlier upload of the shard's key is aborted and the run's own, in parts, completes: an abort
    takes only the upload it names."""
    s3.make_bucket("own")
    s3.leave_incomplete_upload("own", "out/shard-000000.tar")
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": "y" * 100_000, "i": i}) + "\n" for i in range(70)))
    store = open_store(parse_address("s3://own/out"), part_size=5 << 20, multipart_threshold=6 << 20)
    notes: list[str] = []
    options = WriteOptions.parse(parts=["text=txt"], maxcount=1000)
    write_remote(
        [JsonlSource(path)], "s3://own/out", options, store=store, tmp_path=tmp_path, note=notes.append
    )
    assert "-" in s3.client().head_object(Bucket="own", Key="out/shard-000000.tar")["ETag"], "not multipart"
    assert s3.incomplete_uploads("own") == []
    assert notes == ["Aborted 1 incomplete upload an earlier run left: shard-000000.tar"]


def test_a_server_that_will_not_list_incomplete_uploads_costs_a_write_one_note(source, tmp_path, monkeypatch):
    """Listing the incomplete uploads needs a permission of its own (s3:ListBucketMultipartUploads): a
    user without it still writes the dataset, told so in one line."""
    pytest.importorskip("moto.server", reason="moto[server] is needed for the object-storage tests")
    with S3Server(tmp_path / "moto.log", open_requests=4) as server:
        server.make_bucket("guarded")
        for name, value in server.user_without("s3:ListBucketMultipartUploads").items():
            monkeypatch.setenv(name, value)
        args = ["--part", "text=txt", "--no-progress", "--tmp-path", str(tmp_path / "t")]
        result = run_shardprep("write", str(source), "s3://guarded/out", *args)
        assert result.returncode == 0, result.stderr
        assert ".nv-meta/.info.json" in [
            info.name for info in open_store(parse_address("s3://guarded/out")).list()
        ]
    notes = [line for line in result.stderr.splitlines() if line.strip()]
    assert notes == [
        "Note: The server does not list the incomplete multipart uploads below s3://guarded/out"
        " (AccessDenied). Any an earlier run left there stay (a lifecycle rule can abort them)."
    ]


def _until(condition, seconds: float = 10.0):
    """`condition()` once true (polled), or its last value after `seconds`."""
    import time

    deadline = time.monotonic() + seconds
    while not (value := condition()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return value


#: The shards whole before the seventh record of nine, two to a shard.
WANTED = {"out/shard-000000.tar", "out/shard-000001.tar"}


#: Their staged local copies, by name and size, once sent.
EMPTIED = {"shard-000000": 0, "shard-000001": 0}


def _staged_shards(folder):
    """The first two shards' staged files below `folder`, by name and size."""
    staged = folder.rglob("shard-*.tar.shardprep-*.tmp")
    return {path.name.split(".")[0]: path.stat().st_size for path in staged if path.name[:12] in EMPTIED}


def test_into_an_empty_prefix_each_shard_goes_up_while_the_write_goes_on_and_its_local_copy_is_emptied(
    s3, tmp_path
):
    """Shards 0 and 1 are in the bucket, and their local copies empty, before the write has read its
    seventh record; the dataset in the bucket equals a local write's all the same."""
    from prep.write.sources import DictSource

    s3.make_bucket("streamed")
    rows = [{"__key__": f"{i:03d}", "txt": f"text {i} " + "z" * 3000} for i in range(9)]
    during: dict = {}

    def records():
        for i, row in enumerate(rows):
            if i == 6:  # shards 0 and 1 (two samples each) are whole by now
                during["keys"] = _until(lambda: WANTED <= set(s3.keys("streamed"))) and set(
                    s3.keys("streamed")
                )
                during["local"] = _until(lambda: _staged_shards(tmp_path / "t") == EMPTIED)
            yield row

    options = WriteOptions.parse(maxcount=2)
    store = open_store(parse_address("s3://streamed/out"))
    write_remote([DictSource(records())], "s3://streamed/out", options, store=store, tmp_path=tmp_path / "t")
    assert during["keys"] == WANTED, "no index before the end"
    assert during["local"], "the local copies of the shards sent are emptied"
    s3.download_prefix("streamed", "out", tmp_path / "fetched")
    from prep.write.run import write_dataset

    write_dataset(rows, tmp_path / "local", maxcount=2)
    assert files(tmp_path / "fetched") == files(tmp_path / "local")


def test_a_write_that_fails_after_shards_went_up_deletes_them_and_over_a_dataset_sends_none_early(
    s3, tmp_path
):
    from prep.write.sources import DictSource

    s3.make_bucket("failing")
    store = open_store(parse_address("s3://failing/out"))

    def records(fail_after_upload: bool):
        for i in range(9):
            if i == 6 and fail_after_upload:
                assert _until(lambda: "out/shard-000001.tar" in s3.keys("failing"))
                raise RuntimeError("the source broke")
            yield {"__key__": f"{i:03d}", "txt": f"text {i}"}

    options = WriteOptions.parse(maxcount=2)
    with pytest.raises(RuntimeError, match="the source broke"):
        write_remote([DictSource(records(True))], "s3://failing/out", options, store=store, tmp_path=tmp_path)
    assert s3.keys("failing") == [] and s3.incomplete_uploads("failing") == []
    store.put("old.txt", b"a file already there")
    seen = []

    def watched():
        for i, row in enumerate(records(False)):
            if i == 8:
                seen.extend(s3.keys("failing"))
            yield row

    again = WriteOptions.parse(maxcount=2, overwrite=True)
    write_remote([DictSource(watched())], "s3://failing/out", again, store=store, tmp_path=tmp_path)
    assert seen == ["out/old.txt"], "over objects already there, nothing goes up before the write is done"
    assert "out/shard-000003.tar" in s3.keys("failing")


def test_a_bucket_write_with_resume_goes_on_from_what_a_failed_run_finished(s3, tmp_path):
    """What a failed run wrote is kept under --tmp-path, the bucket left empty (nothing goes up before the
    write is done). A rerun over an object the write does not write is refused after the write, which it
    keeps, whole; the next rerun reuses all of it, the bucket gets the dataset a clean write makes, and
    the kept folder goes."""
    from prep.errors import PrepError
    from prep.write import BadInputError, open_sources, write_dataset
    from tests.support.write import rows_file

    s3.make_bucket("resumed")
    good, bad = rows_file(tmp_path / "a.jsonl", 300), rows_file(tmp_path / "b.jsonl", 300)
    bad.write_text(bad.read_text().replace('{"n": 250,', '{"n": 250', 1))
    store = open_store(parse_address("s3://resumed/out"))
    options = WriteOptions.parse(maxcount=20, resume=True)
    tmp = tmp_path / "t"
    store.put("old.txt", b"no run of this write left it")
    with pytest.raises(PrepError, match="is not empty"):  # --resume, but nothing here to go on from
        write_remote(open_sources([good, bad]), "s3://resumed/out", options, store=store, tmp_path=tmp)
    store.delete("old.txt")
    with pytest.raises(BadInputError, match="b.jsonl:251"):
        write_remote(open_sources([good, bad]), "s3://resumed/out", options, store=store, tmp_path=tmp)
    kept = [path.name for path in tmp.iterdir()]
    assert s3.keys("resumed") == [] and len(kept) == 1 and kept[0].startswith("shardprep-write-resume-"), kept
    rows_file(bad, 300)
    store.put("notes.txt", b"someone else's")  # --resume takes only what its own run could have left
    with pytest.raises(PrepError, match=r"holds objects this write does not write \(1, e.g. notes.txt\)"):
        write_remote(open_sources([good, bad]), "s3://resumed/out", options, store=store, tmp_path=tmp)
    assert s3.keys("resumed") == ["out/notes.txt"] and len(list(tmp.iterdir())) == 1
    store.delete("notes.txt")
    summary = write_remote(open_sources([good, bad]), "s3://resumed/out", options, store=store, tmp_path=tmp)
    # the refused run had written every block, and kept them all: the rerun only uploads
    assert summary.resumed == (30, 30, 2, 2), summary.resumed
    assert list(tmp.iterdir()) == []
    write_dataset(open_sources([good, bad]), tmp_path / "clean", maxcount=20)
    s3.download_prefix("resumed", "out", tmp_path / "fetched")
    assert files(tmp_path / "fetched") == files(tmp_path / "clean")
