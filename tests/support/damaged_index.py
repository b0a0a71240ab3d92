"""An `index.sqlite` with a page of zeros in the middle of a table: opening it works, reading it through
fails ("database disk image is malformed"), as a disk or a copy gone wrong leaves one."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from prep.index.sqlite import MediaIndexWriter
from prep.prepare import prepare_dataset
from tests.support.shards import sample_members, write_tarfile


def zero_leaf_pages(index: Path, table: str) -> None:
    """Overwrite with zeros a page from the middle of `table`'s rows and of each of its indexes (not the
    first, which opening a reader reads), whichever a query reads them through."""
    with closing(sqlite3.connect(f"{index.as_uri()}?mode=ro", uri=True)) as db:
        size = db.execute("PRAGMA page_size").fetchone()[0]
        trees = [
            name for (name,) in db.execute("SELECT name FROM sqlite_schema WHERE tbl_name = ?", (table,))
        ]
        leaves = [
            db.execute("SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf'", (tree,)).fetchall()
            for tree in trees
        ]
    with open(index, "r+b") as file:
        for pages in leaves:
            assert len(pages) > 2, f"too few pages to damage one in the middle: {pages}"
            file.seek((sorted(pages)[len(pages) // 2][0] - 1) * size)
            file.write(bytes(size))


def dataset_with_damaged_index(folder: Path, table: str) -> Path:
    """A prepared dataset of one shard of 1,500 samples (a few pages of each table) whose `table` has a page
    of zeros: `.nv-meta/index.sqlite`."""
    write_tarfile(folder / "shard-000.tar", sample_members("sample-", 1500))
    prepare_dataset(folder, sample_type="CrudeWebdataset")
    zero_leaf_pages(folder / ".nv-meta" / "index.sqlite", table)
    return folder


def described_by_extension(index: Path, rows: int = 1500) -> None:
    """Add `rows` media rows (a few pages) and the extension filter to `index`, as prepare-media records them."""
    with MediaIndexWriter(index) as media:
        media.add_media((f"sample-{i:06d}.jpg", "image", '{"width":1}') for i in range(rows))
        media.add_media_filter("EXTENSION", "")
        media.commit()
