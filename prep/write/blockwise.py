"""`write --engine ray` and `write --resume` of JSONL, CSV and Parquet files: blocks read in parallel.

The stages, each a map over the run's engine (`engine_map`: Ray tasks, `prep.engines.ray_cluster`, or
worker processes here), results in input order; with `--resume` each block's count and segments and
each shard are kept as they come and taken from what an earlier run kept (`resume.WriteCheckpoint`):

1. the inputs cut into blocks here (`blocks.plan_blocks`), every block counted by a task
   (`blocks.count_block`) and the counts added up (`blocks.counted_blocks`: generated keys, line numbers);
2. each block's records through the key, split and parts stages in a task, written to one segment per
   split (`segments.encode_block`); here, in input order, the first bad record stops the run (a
   duplicate `--key-column` key across blocks included) and the shards are cut (`segments.ShardPlanner`);
3. each shard assembled from its segments' bytes by a task (`segments.assemble_shard`), taken into the
   build as `write` takes a shard written elsewhere.

The output is byte for byte what one process writes. Options whose result depends on the whole input
seen in order are refused by name (`refusal`). Tasks write into this run's staging, so workers on
other machines need OUT_DIR on a shared filesystem at the same path.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prep.engines import LOCAL
from prep.processes import ordered_map, worker_count
from prep.write.blocks import Block, BlockCount, count_block, counted_blocks, plan_blocks, supported
from prep.write.options import WriteOptions
from prep.write.segments import AssembleJob, EncodeJob, ShardPlanner, assemble_shard, encode_block
from prep.write.sources import Source

if TYPE_CHECKING:
    from prep.write.resume import WriteCheckpoint
    from prep.write.run import WriteRun

#: A block's size: big enough that a task's overhead is small, small enough for several per worker.
BLOCK_BYTES = 32 << 20
BLOCK_ROWS = 200_000
#: A map of a function over tasks, results in task order (`prep.processes.ordered_map`'s shape).
Mapper = Callable[..., Iterator[Any]]


@contextmanager
def engine_map(options: WriteOptions, workers: int) -> Iterator[Mapper]:
    """The map the options ask for, as `mapper(function, tasks, what=..., name=...)`: worker processes
    here, or Ray tasks on one Ray instance or cluster for the whole `with` block."""
    if options.engine == LOCAL:
        maps: list[Generator] = []

        def local(
            function: Callable, tasks: Sequence[tuple], *, what: str, name: Callable = repr
        ) -> Iterator:
            maps.append(ordered_map(function, tasks, workers, what=what))
            return maps[-1]

        try:
            yield local
        finally:  # the workers end with the block, not when an error's traceback lets go of the map
            for mapped in maps:
                mapped.close()
        return
    from prep.engines.ray_cluster import RayEngine  # Ray is slow to import: only for --engine ray

    with RayEngine(options.ray_address, workers) as cluster:
        yield cluster.ordered_map


def refusal(options: WriteOptions, sources: list[Source]) -> str | None:
    """Why this write cannot go in blocks (naming the option or input), or None if it can."""
    if options.group_contiguous:
        return (
            "--group-contiguous gathers each group from the whole input before any shard is cut, which"
            " blocks read apart cannot do the same way"
        )
    if options.on_error != "stop":
        return (
            "--on-error skip lists rejects in input order and numbers generated keys past them, which"
            " blocks read apart cannot reproduce byte for byte"
        )
    if options.polylithic:
        return "--media-column (an auxiliary media dataset) is not written in blocks yet"
    for source in sources:
        if not supported(source):
            return f"{source.name} is not a JSONL, CSV or Parquet file (folders, parallel text and Python iterables are read in one process)"
    return None


def write_in_blocks(run: WriteRun, sources: list[Source], checkpoint: WriteCheckpoint | None = None) -> None:
    """Write `sources` into `run`'s primary build, block by block on the run's engine; with a
    `checkpoint`, what an earlier run finished is taken from it and what this one finishes kept in it."""
    options = run.options
    blocks, problem = plan_blocks(sources, BLOCK_BYTES, BLOCK_ROWS)
    if not blocks:
        if problem is not None:
            raise problem
        return
    workers = worker_count(options.num_workers, len(blocks))
    build = run.primary
    folder = str(build.staging.meta_file("segments"))
    Path(folder).mkdir(exist_ok=True)
    with engine_map(options, workers) as mapper:

        def count(some: list[Block]) -> list[BlockCount]:
            kept = [checkpoint.count(block) if checkpoint else None for block in some]
            missing = [(block,) for block, saved in zip(some, kept, strict=True) if saved is None]
            fresh = mapper(count_block, missing, what="counting records", name=_named)
            counts = []
            for block, saved in zip(some, kept, strict=True):
                if saved is None:
                    saved = next(fresh)
                    if checkpoint is not None:
                        checkpoint.save_count(block, saved)
                counts.append(saved)
            return counts

        blocks = counted_blocks(blocks, count, BLOCK_BYTES)
        jobs = [
            EncodeJob(block, number, options, folder, build.headers) for number, block in enumerate(blocks)
        ]
        kept = [checkpoint.encoded(job.number, job.block, folder) if checkpoint else None for job in jobs]
        missing = [(job,) for job, saved in zip(jobs, kept, strict=True) if saved is None]
        fresh = mapper(
            encode_block, missing, what="encoding records", name=lambda task: task[0].block.describe()
        )
        planner = ShardPlanner(options.limits)
        seen: set[str] = set()
        reused, reusable = 0, len(jobs) - len(missing)
        run.stage("encoding blocks", 0, len(jobs))
        for job, saved in zip(jobs, kept, strict=True):
            reused += saved is not None
            done = saved if saved is not None else next(fresh)
            _check_block(run, done, seen)
            if saved is None and checkpoint is not None:
                checkpoint.save_encoded(job.number, job.block, done)
            planner.add(done)
            nbytes = sum(sum(segment.sizes) for segment in done.segments.values())
            run.samples += done.records
            run.bytes += nbytes
            if saved is not None:
                run.reused_samples += done.records
                run.reused_bytes += nbytes
            run.stage("encoding blocks", job.number + 1, len(jobs), (reused, reusable))
        if problem is not None:  # a source that could not be cut, met after every record before it
            raise problem
        shards = planner.finish()
        slots = [build.reserve_shard(shard.split, options.split_folder(shard.split)) for shard in shards]
        assembly = [
            AssembleJob(
                slot.shard, str(slot.path), str(slot.tar_index_path), str(slot.rows_path), shard.pieces
            )
            for slot, shard in zip(slots, shards, strict=True)
        ]
        finished = [checkpoint.assembled(job) if checkpoint else None for job in assembly]
        missing = [(job,) for job, saved in zip(assembly, finished, strict=True) if saved is None]
        written = mapper(assemble_shard, missing, what="writing shards", name=lambda task: task[0].shard)
        reused, reusable = 0, len(assembly) - len(missing)
        run.stage("writing shards", 0, len(slots))
        last_use = {piece.segment: number for number, job in enumerate(assembly) for piece in job.pieces}
        for number, (slot, job, saved) in enumerate(zip(slots, assembly, finished, strict=True)):
            reused += saved is not None
            result = saved if saved is not None else next(written)
            if saved is None and checkpoint is not None:
                checkpoint.save_assembled(job, result)
            build.adopt(slot, *result)
            for piece in job.pieces:  # a segment no later shard needs goes now: staging holds less
                if last_use.get(piece.segment) == number:
                    del last_use[piece.segment]
                    Path(piece.segment).unlink()
                    Path(piece.rows_path).unlink()
            run.stage("writing shards", number + 1, len(slots), (reused, reusable))
    _remove_segments(Path(folder))


def _named(task: tuple[Block]) -> str:
    return task[0].describe()


def _check_block(run: WriteRun, done: Any, seen: set[str]) -> None:
    """Stop the run at the block's first bad record, or at an earlier one whose key an earlier block
    has (what one process, seeing every key in order, would stop at)."""
    reject = done.reject
    if done.keys is not None:
        limit = reject[0] if reject is not None else len(done.keys)
        for position, key in enumerate(done.keys[:limit]):
            if key in seen:
                run.reject(done.wheres[position], f"duplicate sample key {key!r}")
            seen.add(key)
    if reject is not None:
        run.reject(reject[1], reject[2])


def _remove_segments(folder: Path) -> None:
    """The segments folder, empty by now (each segment went after the last shard that needed it)."""
    for path in folder.iterdir():
        path.unlink()
    folder.rmdir()
