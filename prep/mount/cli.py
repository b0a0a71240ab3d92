"""`shardprep mount` and `shardprep umount`: the command-line shells over `prep.mount`.

The mount is made by this process in either mode, so a refusal (no FUSE, a busy mount point) reaches
the terminal and the exit status. In the background (the default) a forked child serves it and this
command prints one "mounted at" line, then where the server's messages go, and returns.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from prep.cli import DatasetLocation
from prep.errors import PrepError
from prep.mount.device import FS_TYPE, mounted_here, server_gone, unmount
from prep.mount.messages import SYSLOG_WHERE
from prep.mount.tree import View

if TYPE_CHECKING:
    from prep.index.dataset import PreparedDataset

READY_PREFIX = "mounted at "


def _real(mountpoint: Path) -> Path:
    """The mount point with its links resolved: the kernel mounts on the folder a link leads to (the mount
    table names that one), and fusermount3 refuses a link as the last component."""
    return Path(os.path.realpath(mountpoint))


def _check_mountpoint(mountpoint: Path, dataset: PreparedDataset) -> None:
    over = _dataset_file_below(mountpoint, dataset)
    if over is not None:
        raise PrepError(
            f"The mount point {mountpoint} holds files of the dataset it would serve ({over}): the mount would"
            " hide them from its own server, which would then wait on itself. Mount it outside the dataset's"
            f" folders, e.g. at {dataset.root.parent / (dataset.root.name + '-mount')}."
        )
    if mounted_here(str(mountpoint)) is not None:
        gone = " whose server has died (every access fails: the connection to it is gone)"
        raise PrepError(
            f"{mountpoint} is already a mount point{gone if server_gone(str(mountpoint)) else ''}. Unmount it"
            f" first with `shardprep umount {mountpoint}`."
        )
    try:
        if mountpoint.exists() and not mountpoint.is_dir():
            raise PrepError(
                f"The mount point {mountpoint} is a file; give an empty folder (or a path to create)."
            )
        mountpoint.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PrepError(
            f"The mount point {mountpoint} cannot be made a folder: {error.strerror} ({error.filename})."
            " Give an empty folder, or a path to create in a writable folder."
        ) from None


def _dataset_file_below(mountpoint: Path, dataset: PreparedDataset) -> str | None:
    """A file the mount of `dataset` reads (its index, a shard) at or below `mountpoint`, links followed;
    None if there is none."""
    top = os.path.realpath(mountpoint)
    read = [dataset.meta, *(dataset.shard_path(shard) for shard in dataset.shards)]
    for path in read:
        real = os.path.realpath(path)
        if os.path.commonpath([top, real]) == top:
            return str(path)
    return None


@click.command("mount")
@click.argument("dataset", type=DatasetLocation())
@click.argument("mountpoint", type=click.Path(path_type=Path))
@click.option(
    "--view",
    type=click.Choice([view.value for view in View]),
    default=View.FLAT.value,
    show_default=True,
    help="flat: /KEY.PART; sample: /KEY/PART; shard: /SHARD.tar/KEY/PART.",
)
@click.option(
    "--split",
    default=None,
    help="Show only the samples energon's loader gives for this split (e.g. train): its shards, less the"
    " samples the split file excludes.",
)
@click.option("--foreground", "-f", is_flag=True, help="Serve in this process until Ctrl-C or umount.")
@click.option("--debug", is_flag=True, help="Print each FUSE request to stderr (implies --foreground).")
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="In the background, append what the server says while it serves (e.g. a shard changed under"
    " it) to this file: created with mode 600 (removed again if the mount fails), or appended to with the"
    " mode its owner gave it; never through a symbolic link. Without it they go to"
    f" {SYSLOG_WHERE} if there is one. In the foreground they go to stderr.",
)
def mount_command(
    dataset: Path | str,
    mountpoint: Path,
    view: str,
    split: str | None,
    foreground: bool,
    debug: bool,
    log_file: Path | None,
) -> None:
    """Mount a prepared DATASET read-only at MOUNTPOINT; each sample part appears as a file."""
    from prep.index.dataset import PreparedDataset
    from prep.mount import messages
    from prep.mount.device import fuse_problem
    from prep.mount.serve import serve, serve_in_background
    from prep.mount.tree import MountTree

    if isinstance(dataset, str):  # s3:// or msc://
        raise PrepError(
            f"{dataset} is in object storage; `shardprep mount` serves a dataset in a local folder (or on a"
            " filesystem mounted here). Copy it to a folder first, or mount the bucket with an S3 FUSE"
            " filesystem (s3fs, mountpoint-s3) and give the dataset's folder in it."
        )
    problem = fuse_problem()
    if problem is not None:
        raise PrepError(f"Cannot mount: {problem}")
    dataset, mountpoint = dataset.absolute(), _real(mountpoint)
    background = not (foreground or debug)
    said = messages.in_background(log_file) if background else messages.STDERR
    with said:  # a mount that fails leaves no log file it created and never wrote to
        tree = MountTree(PreparedDataset(dataset), View(view), split, said)
        tree.index.check()
        _check_mountpoint(mountpoint, tree.dataset)
        pid = serve_in_background(tree, str(mountpoint)) if background else None
    if background:
        if tree.warning is not None:  # said in the log too, but the user is here now
            click.echo(f"Warning: {tree.warning}", err=True)
        click.echo(f"{READY_PREFIX}{mountpoint} (pid {pid}); unmount with `shardprep umount {mountpoint}`.")
        if said.where is None:
            click.echo(
                f"Its messages are not kept (no syslog at {messages.SYSLOG_SOCKET}): give --log-file PATH to"
                " keep them, or serve in the foreground with -f to see them."
            )
        else:
            click.echo(f"Its messages go to {said.where}.")
        return

    def ready() -> None:
        click.echo(f"{READY_PREFIX}{mountpoint} (Ctrl-C or `shardprep umount` to unmount)")
        sys.stdout.flush()

    serve(tree, str(mountpoint), trace=debug, on_ready=ready)
    click.echo(f"unmounted {mountpoint}")


@click.command("umount")
@click.argument("mountpoint", type=click.Path(path_type=Path))
@click.option(
    "--lazy", "-z", is_flag=True, help="Detach now even if files are open; unmount when they close."
)
def umount_command(mountpoint: Path, lazy: bool) -> None:
    """Unmount a dataset mounted with `shardprep mount`."""
    mountpoint = _real(mountpoint)
    kind = mounted_here(str(mountpoint))
    if kind is None:
        raise PrepError(f"{mountpoint} is not a mount point, so there is nothing to unmount.")
    if kind != FS_TYPE:
        raise PrepError(
            f"{mountpoint} is a {kind} mount, not a dataset mounted with `shardprep mount`; it was left"
            " mounted. Unmount it with the tool that mounted it (or `umount`) if that is what you meant."
        )
    dead = server_gone(str(mountpoint))
    reason = unmount(str(mountpoint), lazy)
    if reason is not None:
        raise PrepError(
            f"Unmounting {mountpoint} failed: {reason}. If a program still has files open there (`fuser -m"
            f" {mountpoint}` names it), close it, or detach the mount now and let it go when they close with"
            f" `shardprep umount --lazy {mountpoint}`."
        )
    click.echo(f"unmounted {mountpoint}" + (" (its server had died)" if dead else ""))
