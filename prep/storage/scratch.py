"""The local folder a command on a bucket dataset works in: made under `--tmp-path` (the system's
temporary folder by default) and removed when the command ends, whatever ends it."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def scratch_folder(tmp_path: str | Path | None, what: str) -> Iterator[Path]:
    """A new, empty folder `.../dataset` under `tmp_path` (made if missing), for the local side of `what`
    (e.g. "prepare"); removed with its parent when the block ends.

    >>> with scratch_folder(None, "example") as folder:
    ...     folder.name, folder.is_dir(), folder.parent.name.startswith("shardprep-example-")
    ('dataset', True, True)
    >>> folder.parent.exists()
    False
    """
    if tmp_path is not None:
        Path(tmp_path).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"shardprep-{what}-", dir=tmp_path))
    try:
        root = work / "dataset"
        root.mkdir()
        yield root
    finally:
        shutil.rmtree(work, ignore_errors=True)
