"""Bad input: stop with file:line and the reason (nothing half-written), or skip it into a rejects file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from prep.errors import PrepError
from prep.write import BadInputError, open_sources, write_dataset
from tests.support.prepare import run_shardprep, snapshot
from tests.support.write import load_parts, written

GOOD = '{"text": "fine"}'


def jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def write(*args: str):  # noqa: ANN201
    return run_shardprep("write", *map(str, args), "--no-progress")


def rejects(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_malformed_jsonl_line_stops_with_file_line_and_writes_nothing(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "rows.jsonl", [GOOD, GOOD, '{"text": "cut', GOOD])
    result = write(source, tmp_path / "out")
    assert result.returncode == 1
    assert f"{source}:3: not valid JSON" in result.stderr
    assert "--on-error skip" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_malformed_jsonl_line_is_skipped_into_the_rejects_file(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "rows.jsonl", [GOOD, "[1, 2]", GOOD, '{"text": "cut'])
    result = write(source, tmp_path / "out", "--on-error", "skip")
    assert result.returncode == 0, result.stderr
    assert (
        f"Rejected 2 inputs; they are listed with their reasons in {tmp_path / 'out' / 'rejects.jsonl'}"
        in result.stdout
    )
    listed = rejects(tmp_path / "out" / "rejects.jsonl")
    assert [(r["where"], r["input"]) for r in listed] == [
        (f"{source}:2", "[1, 2]"),
        (f"{source}:4", '{"text": "cut'),
    ]
    assert "not an object" in listed[0]["reason"] and "not valid JSON" in listed[1]["reason"]
    assert list(load_parts(tmp_path / "out").values()) == [{"json": GOOD.encode()}] * 2


def test_csv_row_with_wrong_field_count(tmp_path: Path) -> None:
    source = tmp_path / "rows.csv"
    source.write_text('a,b\n1,2\n"multi\nline",3\n4,5,6\n7,8\n')
    stopped = write(source, tmp_path / "out")
    assert stopped.returncode == 1
    assert f"{source}:5: the row has 3 fields, the header has 2" in stopped.stderr
    skipped = write(source, tmp_path / "out", "--on-error", "skip")
    assert skipped.returncode == 0, skipped.stderr
    assert rejects(tmp_path / "out" / "rejects.jsonl") == [
        {"where": f"{source}:5", "reason": "the row has 3 fields, the header has 2", "input": "4,5,6"}
    ]
    assert len(load_parts(tmp_path / "out")) == 3


def test_parquet_column_of_unsupported_type(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import datetime

    import pyarrow.parquet as pq

    when = [datetime.datetime(2024, 1, day) for day in (1, 2)]
    pq.write_table(pa.table({"text": ["a", "b"], "when": when}), tmp_path / "rows.parquet")
    result = write(tmp_path / "rows.parquet", tmp_path / "out")
    assert result.returncode == 1
    assert f"{tmp_path / 'rows.parquet'}:row 1: column 'when' has type timestamp[us]" in result.stderr
    mapped = write(tmp_path / "rows.parquet", tmp_path / "out", "--part", "text=txt")
    assert mapped.returncode == 0, mapped.stderr  # a column left out of the mapping is not read


def test_missing_media_file(tmp_path: Path) -> None:
    (tmp_path / "a.jpg").write_bytes(b"jpeg")
    source = jsonl(tmp_path / "rows.jsonl", ['{"image": "a.jpg"}', '{"image": "gone.jpg"}'])
    for flags in (("--part", "image=jpg"), ("--media-column", "image")):
        result = write(source, tmp_path / "out", *flags)
        assert result.returncode == 1
        assert f"{source}:2: missing media file 'gone.jpg'" in result.stderr
        assert not (tmp_path / "out").exists()


def test_duplicate_key(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "rows.jsonl", ['{"id": "a"}', '{"id": "b"}', '{"id": "a"}'])
    result = write(source, tmp_path / "out", "--key-column", "id")
    assert result.returncode == 1 and f"{source}:3: duplicate sample key 'a'" in result.stderr
    skipped = write(source, tmp_path / "out", "--key-column", "id", "--on-error", "skip")
    assert skipped.returncode == 0
    assert sorted(load_parts(tmp_path / "out")) == ["a", "b"]


def test_key_that_energon_would_cut_is_refused(tmp_path: Path) -> None:
    with pytest.raises(
        PrepError, match="<iterable>:1: sample key 'a.b' would not survive energon's key rule"
    ):
        write_dataset([{"__key__": "a.b", "txt": "x"}], tmp_path / "out")


def test_value_that_cannot_be_encoded_for_its_extension(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "rows.jsonl", ['{"label": 3}', '{"label": "three"}', '{"label": {"n": 3}}'])
    result = write(source, tmp_path / "out", "--part", "label=cls", "--on-error", "skip")
    assert result.returncode == 0
    reasons = [r["reason"] for r in rejects(tmp_path / "out" / "rejects.jsonl")]
    assert len(reasons) == 2 and all("class label must be an integer" in reason for reason in reasons)
    with pytest.raises(PrepError, match="would be pickled"):
        write_dataset([{"pickle": object()}], tmp_path / "p")
    pickled = write(jsonl(tmp_path / "p.jsonl", ['{"obj": [1, 2]}']), tmp_path / "p", "--part", "obj=pkl")
    assert pickled.returncode == 1
    assert "(--allow-pickle) or choose json, msgpack or npy. Nothing was written." in pickled.stderr


def test_non_empty_out_dir_needs_overwrite_and_a_failed_overwrite_keeps_the_old_dataset(
    tmp_path: Path,
) -> None:
    good = jsonl(tmp_path / "good.jsonl", [GOOD] * 5)
    bad = jsonl(tmp_path / "bad.jsonl", [GOOD] * 3 + ["nope"])
    assert write(good, tmp_path / "out").returncode == 0
    before = snapshot(tmp_path / "out")
    refused = write(good, tmp_path / "out")
    assert refused.returncode == 1 and "is not empty" in refused.stderr and "--overwrite" in refused.stderr
    failed = write(bad, tmp_path / "out", "--overwrite", "--maxcount", "1")
    assert failed.returncode == 1 and f"{bad}:4" in failed.stderr
    assert snapshot(tmp_path / "out") == before
    replaced = write(
        jsonl(tmp_path / "two.jsonl", ['{"t": 2}'] * 2),
        tmp_path / "out",
        "--overwrite",
        "--split-ratio",
        "1,1,0",
    )
    assert replaced.returncode == 0, replaced.stderr
    assert not (tmp_path / "out" / "shard-000000.tar").exists(), "old shards are gone"
    info = json.loads((tmp_path / "out" / ".nv-meta" / ".info.json").read_text())
    assert sum(info["shard_counts"].values()) == 2 and all("/" in shard for shard in info["shard_counts"])


def test_interrupted_write_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    def rows():
        for i in range(50):
            yield {"txt": f"row {i}"}
        raise KeyboardInterrupt

    (tmp_path / "out").mkdir()
    with pytest.raises(KeyboardInterrupt):
        write_dataset(rows(), tmp_path / "out", maxcount=10)
    assert list((tmp_path / "out").iterdir()) == []


def test_misaligned_parallel_text_and_bad_alignment(tmp_path: Path) -> None:
    (tmp_path / "src").write_text("a b\nc d\ne\n")
    (tmp_path / "tgt").write_text("x y\nz\n")
    result = write(tmp_path / "src", tmp_path / "tgt", tmp_path / "out", "--format", "parallel")
    assert (
        result.returncode == 1
        and f"{tmp_path / 'src'}:3: {tmp_path / 'tgt'} ended before line 3" in result.stderr
    )
    (tmp_path / "tgt").write_text("x y\nz\nw\n")
    (tmp_path / "align").write_text("0-0 1-1\n0-0 1-3\n0-0\n")
    skipped = write(
        tmp_path / "src",
        tmp_path / "tgt",
        tmp_path / "align",
        tmp_path / "out",
        "--format",
        "parallel",
        "--on-error",
        "skip",
    )
    assert skipped.returncode == 0, skipped.stderr
    assert rejects(tmp_path / "out" / "rejects.jsonl") == [
        {
            "where": f"{tmp_path / 'align'}:2",
            "reason": "alignment target position 3 is past the 1 target tokens",
            "input": "0-0 1-3",
        }
    ]


@pytest.mark.parametrize("pair", ["²-1", "٣-٠", "０-１"])
def test_an_alignment_pair_of_digits_other_than_ascii_is_a_reject_naming_it(
    tmp_path: Path, pair: str
) -> None:
    """`str.isdigit` takes them: '²-1' ended the run in int()'s error, '٣-٠' was written as 3-0."""
    from prep.write.sources import Reject
    from prep.write.sources.parallel_text import ParallelTextSource

    (tmp_path / "src").write_text("a b c d\n")
    (tmp_path / "tgt").write_text("x y\n")
    (tmp_path / "align").write_text(f"0-0 {pair}\n")
    (source,) = ParallelTextSource.open([tmp_path / "src", tmp_path / "tgt", tmp_path / "align"])
    (reject,) = list(source.records())
    assert isinstance(reject, Reject)
    assert (reject.where, reject.reason) == (
        f"{tmp_path / 'align'}:1",
        f"alignment {pair!r} is not a pharaoh pair i-j",
    )


def files_under(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


def test_key_that_would_leave_the_dataset_is_refused_and_nothing_lands_outside(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jpg").write_bytes(b"IMG1")
    source = jsonl(data / "m.jsonl", ['{"id": "../../escaped", "img": "a.jpg", "t": "x"}'])
    result = write(source, tmp_path / "out", "--key-column", "id", "--media-column", "img", "--part", "t=txt")
    assert result.returncode == 1
    assert (
        f"{source}:1: sample key '../../escaped' is not a relative path inside the dataset" in result.stderr
    )
    assert files_under(tmp_path) == ["data", "data/a.jpg", "data/m.jsonl"]
    for key, problem in [
        (f"{tmp_path}/absolute", "it starts with a slash"),
        ("a//b", "it has an empty part"),
        ("./a", "it has a '.' part"),
        ("a/../../b", "it has a '..' part"),
    ]:
        with pytest.raises(BadInputError, match=f"<iterable>:1: sample key .* {problem}"):
            write_dataset(
                [{"__key__": key, "img": b"IMG1", "txt": "x"}], tmp_path / "o2", media_columns=["img=jpg"]
            )
    assert files_under(tmp_path) == ["data", "data/a.jpg", "data/m.jsonl"]


def test_media_extension_with_a_slash_is_not_a_way_out(tmp_path: Path) -> None:
    (tmp_path / "dir.d").mkdir()
    (tmp_path / "a").write_bytes(b"IMG1")
    rows = [{"__key__": "k", "img": str(tmp_path / "dir.d/../a"), "txt": "x"}]
    with pytest.raises(BadInputError, match="cannot tell the file type of media field 'img'"):
        write_dataset(rows, tmp_path / "out", media_columns=["img"])
    with pytest.raises(PrepError, match="Invalid --media-column 'img=x/../../y'"):
        write_dataset(rows, tmp_path / "out", media_columns=["img=x/../../y"])
    assert files_under(tmp_path) == ["a", "dir.d"]


@pytest.mark.parametrize("pattern", ["../esc-%06d.tar", "/tmp/esc-%06d.tar", "shards//s-%d.tar"])
def test_shard_pattern_that_leaves_out_dir_is_refused(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(PrepError, match="must name shards inside OUT_DIR"):
        write_dataset([{"txt": "x"}], tmp_path / "out", shard_pattern=pattern)
    assert list(tmp_path.iterdir()) == []
    write_dataset([{"txt": "x"}], tmp_path / "out", shard_pattern="shards/s-%06d.tar")
    assert (tmp_path / "out" / "shards" / "s-000000.tar").is_file()


def test_shard_pattern_whose_name_grows_too_long_at_a_later_shard_stops_with_the_old_output_untouched(
    tmp_path: Path,
) -> None:
    """What a number conversion changes from one shard to the next is the name's length: each name is
    checked as its shard is begun, before the run commits anything."""
    out = tmp_path / "out"
    write_dataset([{"txt": "old"}], out)
    before = snapshot(out)
    pattern = "x" * 245 + "-%d.tar"  # shard 9's .tar.idx takes 255 bytes, shard 10's would take 256
    rows = [{"txt": str(i)} for i in range(11)]
    with pytest.raises(PrepError) as refused:
        write_dataset(rows, out, shard_pattern=pattern, maxcount=1, overwrite=True)
    assert str(refused.value).startswith(f"--shard-pattern {pattern!r} names shard 10 {'x' * 245}-10.tar,")
    assert "would be 256 bytes, more than the 255 a file name may have" in str(refused.value)
    assert snapshot(out) == before


def test_overwrite_never_deletes_a_source_inside_out_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    source = jsonl(data / "rows.jsonl", [GOOD])
    result = write(source, data, "--overwrite")
    assert result.returncode == 1
    assert f"SOURCE {source} is inside OUT_DIR {data}" in result.stderr and "Traceback" not in result.stderr
    assert files_under(tmp_path) == ["data", "data/rows.jsonl"]
    (data / "0001.txt").write_text("c1")
    for out in (data, tmp_path / "link"):  # the folder itself, and a link to it
        if out.name == "link":
            out.symlink_to(data)
        with pytest.raises(PrepError, match="is inside OUT_DIR"):
            write_dataset(open_sources([data]), out, overwrite=True)
    with pytest.raises(PrepError, match=f"OUT_DIR {data / 'out'} is inside the folder SOURCE {data}"):
        write_dataset(open_sources([data]), data / "out")
    assert files_under(data) == ["0001.txt", "rows.jsonl"]


def test_rejects_naming_a_source_is_refused_before_it_is_replaced(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "rows.jsonl", [GOOD])
    before = source.read_bytes()
    result = write(source, tmp_path / "out", "--on-error", "skip", "--rejects", str(source))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"--rejects {source} is SOURCE {source}, which the run would replace" in result.stderr
    assert source.read_bytes() == before and not (tmp_path / "out").exists()


def test_folder_source_does_not_take_an_earlier_written_dataset_as_samples(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()
    (images / "0001.txt").write_text("c1")
    write_dataset(open_sources([images]), tmp_path / "out")
    (tmp_path / "out").rename(images / "out")
    write_dataset(open_sources([images]), tmp_path / "again")
    assert load_parts(tmp_path / "again") == {"0001": {"txt": b"c1"}}
    with pytest.raises(PrepError, match=f"{images / 'out'} is a prepared dataset"):
        write_dataset(open_sources([images / "out"]), tmp_path / "third")


def test_parquet_string_that_is_not_utf8_is_refused_by_row(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table({"text": ["fine", "hello", "also fine"]})
    pq.write_table(table, tmp_path / "rows.parquet", compression="none", use_dictionary=False)
    data = (tmp_path / "rows.parquet").read_bytes()
    (tmp_path / "rows.parquet").write_bytes(data.replace(b"hello", b"\xe8ello"))
    with pytest.raises(BadInputError, match=r"rows.parquet:row 2: a string that is not UTF-8"):
        write_dataset(open_sources([tmp_path / "rows.parquet"]), tmp_path / "out")
    summary = write_dataset(open_sources([tmp_path / "rows.parquet"]), tmp_path / "out", on_error="skip")
    assert summary.samples == 2 and summary.rejects == 1


def test_a_stray_quote_in_csv_or_tsv_is_refused_at_its_line_not_joined_with_the_rows_after_it(
    tmp_path: Path,
) -> None:
    csv_path = tmp_path / "q.csv"
    csv_path.write_text('id,text\n1,"open quote only\n2,plain\n3,more\n')
    with pytest.raises(BadInputError, match=r"q.csv:2: unreadable CSV \(unexpected end of data\)"):
        write_dataset(open_sources([csv_path]), tmp_path / "o1", key_column="id", parts=["text=txt"])
    tsv_path = tmp_path / "q.tsv"  # quoted as pandas writes TSV; the second row's quote is left open
    tsv_path.write_text('id\ttext\n1\t"""Hello,"" she said"\n2\t"Hello," she said\n3\tplain\n')
    with pytest.raises(BadInputError, match=r"q.tsv:3: unreadable CSV \('\t' expected after '\"'\)"):
        write_dataset(open_sources([tsv_path]), tmp_path / "o2", key_column="id", parts=["text=txt"])
    summary = write_dataset(
        open_sources([tsv_path]), tmp_path / "o2", key_column="id", parts=["text=txt"], on_error="skip"
    )
    assert summary.rejects == 1
    assert load_parts(tmp_path / "o2") == {"1": {"txt": b'"Hello," she said'}, "3": {"txt": b"plain"}}


def test_a_stray_quote_in_a_later_csv_block_stops_the_run_as_one_pass_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prep.write import blockwise

    monkeypatch.setattr(blockwise, "BLOCK_BYTES", 300)
    path = tmp_path / "in.csv"
    path.write_text(
        "id,text\n"
        + "".join(f"k{n},{'word ' * (n % 7)}\n" for n in range(200)).replace("k150,", 'k150,"open quote only')
    )
    messages = []
    for resume in (True, False):
        with pytest.raises(BadInputError) as raised:
            write_dataset(open_sources([path]), tmp_path / f"out-{resume}", resume=resume)
        messages.append(str(raised.value))
        assert not (tmp_path / f"out-{resume}" / ".nv-meta").exists()
    assert messages[0] == messages[1] and "in.csv:152: unreadable CSV (unexpected end of data)" in messages[0]


@pytest.mark.parametrize(
    ("name", "text", "options"),
    [
        ("rows.csv", "id,text\r\na1,hello\r\na2,world\r\n", {"key_column": "id", "parts": ["text=txt"]}),
        ("rows.csv", "id,text\na1,hello\na2,world\n", {"maxcount": 1, "resume": True}),
        ("rows.jsonl", '{"id": "a1"}\n{"id": "a2"}\n{"id": "a3"}\n', {"maxcount": 1, "num_workers": 2}),
        ("rows.jsonl", '{"id": "a1"}\n{"id": "a2"}\n', {"key_column": "id"}),
        ("rows.jsonl", '{"id": "a1"}\n{"id": "a2"}\n', {"resume": True}),
    ],
)
def test_a_utf8_byte_order_mark_is_not_part_of_the_first_line(
    tmp_path: Path, name: str, text: str, options: dict
) -> None:
    """Excel and some editors start UTF-8 files with a byte order mark: the same dataset as without it."""
    (tmp_path / "plain").mkdir()
    (tmp_path / "bom").mkdir()
    (tmp_path / "plain" / name).write_text(text)
    (tmp_path / "bom" / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
    for folder in ("plain", "bom"):
        write_dataset(open_sources([tmp_path / folder / name]), tmp_path / folder / "out", **options)
    assert written(tmp_path / "bom" / "out") == written(tmp_path / "plain" / "out")
    assert b"\xef\xbb\xbf" not in b"".join(written(tmp_path / "bom" / "out").values())


def test_a_byte_order_mark_is_not_part_of_the_first_parallel_sentence(tmp_path: Path) -> None:
    (tmp_path / "src").write_bytes(b"\xef\xbb\xbfa b\nc\n")
    (tmp_path / "tgt").write_bytes(b"\xef\xbb\xbfx y\nz\n")
    sources = open_sources([tmp_path / "src", tmp_path / "tgt"], "parallel")
    write_dataset(sources, tmp_path / "out")
    assert load_parts(tmp_path / "out")["000000000"] == {"src.txt": b"a b", "tgt.txt": b"x y"}


@pytest.mark.parametrize("resume", [False, True])
def test_a_csv_field_past_the_csv_modules_default_limit_is_written(tmp_path: Path, resume: bool) -> None:
    path = tmp_path / "big.csv"
    path.write_text("id,text\na,short\nb," + "x" * 200_000 + "\n")
    write_dataset(open_sources([path]), tmp_path / "out", key_column="id", parts=["text=txt"], resume=resume)
    assert load_parts(tmp_path / "out")["b"] == {"txt": b"x" * 200_000}


def test_a_bad_csv_row_before_a_byte_that_is_not_utf8_is_named_first_in_one_pass_as_in_blocks(
    tmp_path: Path,
) -> None:
    """A one-pass read decodes the file ahead of its CSV reader: the bad row on line 4 is still the
    problem named, before the bad byte 2 KB further on, as the blockwise read (`resume`) names it; with
    --on-error skip, the byte is named next."""
    path = tmp_path / "rows.csv"
    lines = ["id,text", *(f"{i},hello {i}" for i in range(200))]
    lines[3] = "2,a row,with three fields"
    data = ("\n".join(lines) + "\n").encode() + b"200,caf\xff\n"
    path.write_bytes(data)
    messages = []
    for resume in (False, True):
        with pytest.raises(BadInputError) as stopped:
            write_dataset(open_sources([path]), tmp_path / f"out-{resume}", resume=resume)
        messages.append(str(stopped.value))
    assert messages[0] == messages[1] and f"{path}:4: the row has 3 fields" in messages[0], messages
    assert not (tmp_path / "out-False").exists()
    utf8 = f"{path}: not UTF-8 text (invalid start byte at byte {len(data) - 2})."
    with pytest.raises(PrepError, match=re.escape(utf8)):
        write_dataset(open_sources([path]), tmp_path / "skipped", on_error="skip")
    assert not (tmp_path / "skipped").exists()


def test_parallel_text_that_is_not_utf8_is_named_by_file_line_and_byte(tmp_path: Path) -> None:
    (tmp_path / "src.txt").write_bytes(b"a\nb\nc\n")
    (tmp_path / "tgt.txt").write_bytes(b"x\ny\nz \xe9t\xe9\n")
    sources = [tmp_path / "src.txt", tmp_path / "tgt.txt"]
    message = f"{tmp_path / 'tgt.txt'}:3: not UTF-8 text (invalid continuation byte at byte 6)"
    with pytest.raises(BadInputError, match=re.escape(message)):
        write_dataset(open_sources(sources, "parallel"), tmp_path / "out")
    summary = write_dataset(open_sources(sources, "parallel"), tmp_path / "out", on_error="skip")
    assert summary.samples == 2 and summary.rejects == 1
    assert rejects(tmp_path / "out" / "rejects.jsonl") == [
        {
            "where": f"{tmp_path / 'tgt.txt'}:3",
            "reason": message.partition(":3: ")[2],
            "input": "z \ufffdt\ufffd",
        }
    ]


def test_input_without_a_sample_fails_and_puts_nothing_in_place(tmp_path: Path) -> None:
    """energon refuses an empty dataset (EmptyDatasetError): a write that has no sample to write says so."""
    (tmp_path / "header.csv").write_text("id,text\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    for source in (tmp_path / "header.csv", tmp_path / "empty.jsonl"):
        result = write(source, tmp_path / "out")
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert f"{source}: no sample to write. energon cannot load an empty dataset" in result.stderr
        assert not (tmp_path / "out").exists()
    bad = jsonl(tmp_path / "bad.jsonl", ["[1]", "nope"])
    with pytest.raises(PrepError, match=rf"no sample to write \(2 rejected, the first {bad}:1: a JSON list"):
        write_dataset(open_sources([bad]), tmp_path / "out", on_error="skip")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("header", "problem"),
    [("id,text,text", "column 3 is named 'text' like column 2"), ("id,,text", "column 2 has no name")],
)
@pytest.mark.parametrize("resume", [False, True])
def test_csv_header_with_a_name_twice_or_none_is_refused(
    tmp_path: Path, header: str, problem: str, resume: bool
) -> None:
    """A row is a dict by column name: a second column of one name would silently replace the first."""
    path = tmp_path / "dup.csv"
    path.write_text(f"{header}\n1,a,b\n")
    with pytest.raises(PrepError, match=re.escape(f"{path}:1: the header's {problem}.")):
        write_dataset(open_sources([path]), tmp_path / "out", resume=resume)
    assert not (tmp_path / "out").exists()


def test_rejects_naming_a_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "bad.jsonl", [GOOD, "[1]"])
    (tmp_path / "rdir").mkdir()
    result = write(source, tmp_path / "out", "--on-error", "skip", "--rejects", tmp_path / "rdir")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"--rejects {tmp_path / 'rdir'} is a folder" in result.stderr
    assert not (tmp_path / "out").exists() and list((tmp_path / "rdir").iterdir()) == []
    (tmp_path / "file").write_text("")
    with pytest.raises(PrepError, match=f"{tmp_path / 'file'} is not a folder"):
        write_dataset(
            open_sources([source]), tmp_path / "out", on_error="skip", rejects=tmp_path / "file" / "r"
        )


def test_a_rejects_file_that_cannot_be_put_in_place_undoes_the_whole_write(tmp_path: Path) -> None:
    rejects_path = tmp_path / "rejects.jsonl"

    def rows():  # the path becomes a folder during the run, after it was checked
        yield ["not a dict"]
        rejects_path.mkdir()
        yield {"txt": "fine"}

    with pytest.raises(PrepError, match=f"Could not put {rejects_path} in place: Is a directory"):
        write_dataset(rows(), tmp_path / "out", on_error="skip", rejects=rejects_path)
    assert not (tmp_path / "out").exists(), "the dataset was put in place without its rejects"
    assert not [path for path in tmp_path.rglob("*") if ".shardprep-" in path.name], "a staged file was left"


def test_field_map_reading_a_part_no_sample_has_is_refused(tmp_path: Path) -> None:
    source = jsonl(tmp_path / "r.jsonl", ['{"text": "a"}', '{"text": "b"}'])
    flags = ["--sample-type", "TextSample", "--field-map", '{"text": "txt"}']
    result = write(source, tmp_path / "out", *flags)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "--field-map reads 'text' from 'txt' (part txt), but no sample has that part" in result.stderr
    assert "the parts written are json" in result.stderr and not (tmp_path / "out").exists()
    options = {"sample_type": "TextSample", "field_map": '{"text": "txt,json[text]"}'}
    assert write_dataset(open_sources([source]), tmp_path / "out", **options).samples == 2  # json is one
    with pytest.raises(PrepError, match="but no sample has that part; the parts written are json, txt"):
        rows = [{"txt": "a"}, {"json": {"t": 1}}]  # by-name: known once written
        write_dataset(rows, tmp_path / "dicts", sample_type="TextSample", field_map='{"text": "text"}')
    assert not (tmp_path / "dicts").exists()


def test_a_dict_field_with_a_slash_in_its_name_is_rejected_not_lost(tmp_path: Path) -> None:
    """Member `k1.a/b` is to energon a file `b` in folder `k1.a`: the part would silently not load."""
    rows = [{"__key__": "k1", "a/b": "x", "txt": "hi"}, {"__key__": "k2", "txt": "ok"}]
    with pytest.raises(
        BadInputError, match="<iterable>:1: field 'a/b' has a slash, which a part name may not"
    ):
        write_dataset(rows, tmp_path / "out")
    assert write_dataset(rows, tmp_path / "out", on_error="skip").samples == 1
    assert load_parts(tmp_path / "out") == {"k2": {"txt": b"ok"}}


def test_a_csv_record_is_named_by_the_path_given_when_written_in_blocks(tmp_path: Path) -> None:
    """--resume (and --engine ray) read a CSV in blocks, each with the file's absolute path: the message
    still names it as the user gave it, as the one-process write does."""
    (tmp_path / "bad.csv").write_text('id,text\n1,a\n2,"open\n3,b\n')
    result = subprocess.run(
        [sys.executable, "-m", "prep", "write", "bad.csv", "out", "--key-column", "id", "--resume", "--no-progress"],
        cwd=tmp_path, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 1 and "Error: bad.csv:3: unreadable CSV" in result.stderr, result.stderr


def test_a_rerun_after_a_killed_write_is_not_refused_for_its_empty_split_folders(tmp_path: Path) -> None:
    """SIGKILL leaves the split folders a write made (their staged files go with the next run's lock)."""
    source = jsonl(tmp_path / "rows.jsonl", [GOOD] * 20)
    out = tmp_path / "out"
    for split in ("train", "val", "test"):
        (out / split).mkdir(parents=True)
    result = write(source, out, "--split-ratio", "8,1,1")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("pattern", ["s-%c.tar", "s-%.1s.tar", "s-%d-%d.tar", "s-%(n)d.tar", "s.tar"])
def test_shard_pattern_that_could_name_two_shards_alike_or_leave_out_dir_is_refused(
    tmp_path: Path, pattern: str
) -> None:
    # %c of shard 47 is "/", of shard 0 a NUL; %.1s names shards 1 and 10 alike
    with pytest.raises(PrepError, match="needs one number"):
        write_dataset([{"txt": "x"}], tmp_path / "out", shard_pattern=pattern)
    assert list(tmp_path.iterdir()) == []
