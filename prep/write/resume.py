"""Resumable write (`--resume`): each block's count and segments and each assembled shard kept beside
OUT_DIR as they are done, so a rerun after an interruption (Ctrl-C, SIGKILL, a lost node) redoes only
the rest, and writes what a clean run writes.

    checkpoint = WriteCheckpoint(out_dir, sources, options)
    count = checkpoint.count(block)          # None: count it, then checkpoint.save_count(block, count)
    done = checkpoint.encoded(number, block, folder)      # its segments put back in `folder`
    result = checkpoint.assembled(job)       # the shard and its index files put back at the job's paths

Entries are `prep.index.checkpoint`'s (prepare keeps its shards' rows the same way), keyed by the options
that shape the output (all but where and how the work runs), the piece of work itself, and the path,
size and modification time of its input file (a block) or of every input (a shard); a block is also
redone when a media file its records name by path changed, and so is every shard made from a block
this run encoded: anything changed since is redone. Files are kept as hard links of the staged ones, so keeping them costs no copy.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from prep.engines import LOCAL
from prep.index.checkpoint import Checkpoint, file_key
from prep.write.blocks import Block, BlockCount
from prep.write.options import WriteOptions
from prep.write.segments import AssembleJob, BlockDone
from prep.write.sources import Source

#: Bumped when what an entry holds changes; entries of another version are not reused.
FORMAT = 2


def output_options(options: WriteOptions) -> WriteOptions:
    """The options with those that do not change the output (where and how the work runs) reset."""
    return dataclasses.replace(
        options, overwrite=False, num_workers=None, engine=LOCAL, ray_address=None, rejects=None, resume=False
    )


class WriteCheckpoint:
    """What an earlier (or this) run of the same write over OUT_DIR finished."""

    def __init__(self, out_dir: Path, sources: list[Source], options: WriteOptions) -> None:
        self.saved = Checkpoint(out_dir)
        paths = [Path(source.path) for source in sources]  # type: ignore[attr-defined]
        #: Each input's key by its absolute path: a block is redone when its own file changed.
        self.inputs = {key[0]: key for key in map(file_key, paths)}
        self.options = output_options(options)
        self.reused_blocks = self.reused_shards = 0
        #: Blocks asked for (`encoded`), reused or not.
        self.blocks = 0
        #: Segments encoded by this run: a shard made of one is assembled anew.
        self.fresh_segments: set[str] = set()

    def _key(self, block: Block) -> tuple:
        return (FORMAT, self.inputs[block.path], self.options, block)

    # -- counts -------------------------------------------------------------------------------------------
    def count(self, block: Block) -> BlockCount | None:
        name = f"count {block}"
        return self.saved.load(name) if self.saved.matches(name, self._key(block)) else None

    def save_count(self, block: Block, count: BlockCount) -> None:
        self.saved.save(f"count {block}", self._key(block), count)

    # -- blocks -------------------------------------------------------------------------------------------
    def encoded(self, number: int, block: Block, folder: str) -> BlockDone | None:
        """Block `number`'s result if an earlier run encoded it, its segments put back into `folder`."""
        name = f"block {number}"
        self.blocks += 1
        if not self.saved.matches(name, self._key(block)):
            return None
        done: BlockDone = self.saved.load(name)
        if not _unchanged(done.media_files):  # a media file its records name was changed since
            return None
        for split, segment in done.segments.items():
            segment.path = str(Path(folder) / Path(segment.path).name)
            segment.rows_path = segment.path + ".rows"
            self.saved.restore(name, f".{split}.tar", Path(segment.path))
            self.saved.restore(name, f".{split}.rows", Path(segment.rows_path))
        self.reused_blocks += 1
        return done

    def save_encoded(self, number: int, block: Block, done: BlockDone) -> None:
        files: dict[str, Path] = {}
        for split, segment in done.segments.items():
            files[f".{split}.tar"] = Path(segment.path)
            files[f".{split}.rows"] = Path(segment.rows_path)
            self.fresh_segments.add(Path(segment.path).name)
        self.saved.save(f"block {number}", self._key(block), done, files)

    # -- shards -------------------------------------------------------------------------------------------
    def _shard_key(self, job: AssembleJob) -> tuple:
        pieces = tuple((Path(piece.segment).name, piece.first, piece.stop) for piece in job.pieces)
        return (FORMAT, tuple(self.inputs.values()), self.options, job.shard, pieces)

    def assembled(self, job: AssembleJob) -> Any:
        """The shard's (samples, tar size) if an earlier run assembled it, its files put back in place."""
        name = f"shard {job.shard}"
        if any(Path(piece.segment).name in self.fresh_segments for piece in job.pieces):
            return None  # made of a block encoded anew (its media changed, say): its bytes may differ
        if not self.saved.matches(name, self._shard_key(job)):
            return None
        for suffix, path in self._files(job).items():
            self.saved.restore(name, suffix, path)
        self.reused_shards += 1
        return self.saved.load(name)

    def save_assembled(self, job: AssembleJob, result: tuple[int, int]) -> None:
        self.saved.save(f"shard {job.shard}", self._shard_key(job), result, self._files(job))

    @staticmethod
    def _files(job: AssembleJob) -> dict[str, Path]:
        return {".tar": Path(job.path), ".tar.idx": Path(job.tar_index_path), ".rows": Path(job.rows_path)}

    def remove(self) -> None:
        self.saved.remove()


def _unchanged(files: list[tuple[str, int, int]]) -> bool:
    """Whether every file keyed so (`file_key`) still has that key."""
    try:
        return all(file_key(Path(path)) == (path, size, mtime) for path, size, mtime in files)
    except OSError:
        return False
