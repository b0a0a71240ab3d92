"""Build a dataset's index beside it, then put it in place all at once.

A run writes every new `.tar.idx` under a temporary name and the new `.nv-meta` into a hidden staging
folder. Only when everything is written does `commit` rename the `.tar.idx` files into place and swap the
staging folder with `.nv-meta` (atomically where the kernel offers RENAME_EXCHANGE). A failed or
interrupted run removes its temporary files and leaves the previous index exactly as it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import uuid
from pathlib import Path

from prep.index_format import INDEX_SQLITE, META_DIR, tar_index_name

#: Files every run regenerates; the rest of an existing `.nv-meta` (dataset.yaml, sample_loader.py, the
#: user's own files) is carried over unless the run writes a new version.
_REBUILT = frozenset({INDEX_SQLITE})
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with renameat2(RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return result == 0


class Staging:
    """Temporary names for one run's outputs under dataset `root`."""

    def __init__(self, root: Path, meta_mode: int | None = None) -> None:
        self.root = root
        self.token = uuid.uuid4().hex[:12]
        self.meta = root / META_DIR
        self.staged_meta = root / f"{META_DIR}.shardprep-{self.token}"
        self.staged_indexes: list[tuple[Path, Path]] = []
        self.staged_meta.mkdir()
        if meta_mode is not None:
            os.chmod(self.staged_meta, meta_mode)
        if self.meta.is_dir():
            for entry in self.meta.iterdir():
                if entry.name not in _REBUILT and entry.is_file():
                    shutil.copy2(entry, self.staged_meta / entry.name)

    def meta_file(self, name: str) -> Path:
        """Where to write `.nv-meta/NAME` during the run."""
        return self.staged_meta / name

    def tar_index_file(self, shard: str) -> Path:
        """Where to write a shard's `.tar.idx` during the run (beside the shard, hidden by a temp suffix)."""
        final = self.root / tar_index_name(shard)
        staged = final.with_name(f"{final.name}.shardprep-{self.token}.tmp")
        self.staged_indexes.append((staged, final))
        return staged

    def commit(self) -> None:
        """Move every staged file into place; the `.nv-meta` swap is the last step."""
        for staged, final in self.staged_indexes:
            os.replace(staged, final)
        self.staged_indexes.clear()
        if self.meta.exists():
            if _rename_exchange(self.staged_meta, self.meta):
                shutil.rmtree(self.staged_meta)
                return
            retired = self.root / f"{META_DIR}.shardprep-{self.token}-old"
            os.rename(self.meta, retired)
            os.rename(self.staged_meta, self.meta)
            shutil.rmtree(retired)
        else:
            os.rename(self.staged_meta, self.meta)

    def abort(self) -> None:
        """Remove everything this run staged; the dataset is left as it was before the run."""
        for staged, _ in self.staged_indexes:
            staged.unlink(missing_ok=True)
        self.staged_indexes.clear()
        shutil.rmtree(self.staged_meta, ignore_errors=True)
