"""The `shardprep` command line: a lazy click group, and the kit every command's `cli.py` shares.

Each command lives in its package's `cli.py` (a thin shell over the package) and is imported only when
it runs, so `shardprep --help` stays fast; this module names the commands as strings and never imports
them. The kit states once what several commands share: the DATASET argument, `--progress`,
`--num-workers` and `--field-map` with their help, SIGTERM handled like Ctrl-C (so staged files are
removed and nothing already on disk is touched), and the progress line.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from prep import __version__
from prep.engines import ENGINES, LOCAL
from prep.errors import PrepError
from prep.progress import time_left
from prep.storage.address import is_remote, misspelt_address, without_credentials

# name -> "module:attribute" of a click command. Commands register here, one line each.
COMMANDS: dict[str, str] = {
    "prepare": "prep.prepare.cli:prepare_command",
    "prepare-media": "prep.prepare.cli:prepare_media_command",
    "write": "prep.write.cli:write_command",
    "mount": "prep.mount.cli:mount_command",
    "umount": "prep.mount.cli:umount_command",
    "info": "prep.inspect.cli:info_command",
    "verify": "prep.inspect.cli:verify_command",
    "preview": "prep.inspect.cli:preview_command",
}


class LazyGroup(click.Group):
    """A click group that imports a command's module only when that command is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, _, attribute = target.partition(":")
        return getattr(importlib.import_module(module_name), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="shardprep")
def cli() -> None:
    """Prepare, write, inspect and pack WebDataset shards for megatron-energon."""


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `shardprep` console script: PrepErrors become one paragraph and exit code 1."""
    try:
        result = cli.main(args=argv, prog_name="shardprep", standalone_mode=False)
    except PrepError as error:
        click.echo(f"Error: {error}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    # Without standalone mode click returns `ctx.exit(n)`'s code instead of exiting with it.
    sys.exit(result if isinstance(result, int) else 0)


# -- the kit ----------------------------------------------------------------------------------------------
#: A prepared dataset's folder (the one holding the shards and .nv-meta/).
dataset_argument = click.argument("dataset", type=click.Path(file_okay=False, path_type=Path))


class DatasetLocation(click.ParamType):
    """A dataset that may be in object storage: a local folder as a Path, an `s3://BUCKET/PATH` or
    `msc://PROFILE/PATH` address as the string it is (a Path would fold its `//`)."""

    name = "path"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        if is_remote(value):
            return value  # type: ignore[return-value]
        meant = misspelt_address(str(value))
        if meant is not None and not os.path.lexists(str(value)):  # (a folder `S3:` that is there is one)
            self.fail(
                f"{without_credentials(str(value))} is a local path as written, and not there: write the"
                f" address as {without_credentials(meant)}.",
                param,
                ctx,
            )
        return Path(value)  # type: ignore[arg-type]


tmp_path_option = click.option(
    "--tmp-path",
    type=click.Path(file_okay=False, path_type=Path),
    help="For a dataset in object storage: the local folder under which its files are kept while the command"
    " runs (prepare builds the index there and write the whole dataset, before the upload; prepare-media"
    " adds the media tables to a copy of the index there, then uploads it; info, verify and preview"
    " download the index there) [default: the system's temporary folder].",
)
progress_option = click.option(
    "--progress/--no-progress", default=True, show_default=True, help="Show progress (only on a terminal)."
)
num_workers_option = click.option(
    "--num-workers", type=int, default=None, help="Worker processes [default: the number of CPUs]."
)
engine_option = click.option(
    "--engine",
    type=click.Choice(ENGINES),
    default=LOCAL,
    show_default=True,
    help="Where the work runs: worker processes on this machine, or Ray tasks (pip install shardprep[ray]).",
)
ray_address_option = click.option(
    "--ray-address",
    metavar="ADDR",
    help="With --engine ray: the Ray cluster to use, e.g. 'auto' or 'head-node:6379' [default: start a local"
    " Ray instance for this run].",
)
field_map_option = click.option(
    "--field-map",
    help='dataset.yaml field map, fields to parts as JSON, e.g. \'{"image": "jpg", "caption": "txt"}\'.',
)


def media_metadata_options(command: Callable) -> Callable:
    """energon's three media filters (`prep.media.filter`), given to the command as `media_metadata_by_glob`,
    `media_metadata_by_header` and `media_metadata_by_extension`; at most one may be used."""
    for option in reversed(
        (
            click.option(
                "--media-metadata-by-glob",
                metavar="PATTERNS",
                help="Store media metadata (image size, format, mode) of parts whose name matches one of these"
                " comma-separated glob patterns, e.g. '*.jpg,*.png'.",
            ),
            click.option(
                "--media-metadata-by-header",
                is_flag=True,
                help="Store media metadata of every part its first bytes show to be media (needs `filetype`).",
            ),
            click.option(
                "--media-metadata-by-extension",
                is_flag=True,
                help="Store media metadata of parts with a standard image or audio/video extension.",
            ),
        )
    ):
        command = option(command)
    return command


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def stop_on_sigterm() -> None:
    """Make `kill` (SIGTERM) unwind like Ctrl-C, so a run removes what it staged and leaves the rest."""
    signal.signal(signal.SIGTERM, _interrupt)


def duration(seconds: float) -> str:
    """`h:mm:ss` or `m:ss`.

    >>> duration(75.2), duration(3725)
    ('1:15', '1:02:05')
    """
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Pace:
    """How fast a run of `total` pieces goes since it was made: pieces and samples per second, time left.
    Pieces an earlier run finished (`--resume`) take no time: they count as done, but not in the pace.

    >>> pace = Pace(started=0.0)
    >>> pace.text(10, 40, samples=5000, now=5.0)
    '10/40 shards, 1,000 samples/s, ETA 0:15'
    >>> pace.text(10, 40, samples=5000, now=5.0, reused=(8, 8, 4000))  # 2 scanned; none left to reuse
    '10/40 shards, 200 samples/s, ETA 1:15'
    """

    def __init__(self, what: str = "shards", started: float | None = None) -> None:
        self.what = what
        self.started = time.perf_counter() if started is None else started

    def text(
        self,
        done: int,
        total: int,
        samples: int | None = None,
        now: float | None = None,
        reused: tuple[int, int, int] = (0, 0, 0),
    ) -> str:
        """The line's text; `reused` is (pieces reused so far, pieces to reuse in all, their samples)."""
        elapsed = max((time.perf_counter() if now is None else now) - self.started, 1e-9)
        reused_done, reused_all, reused_samples = reused
        parts = [f"{done:,}/{total:,} {self.what}"]
        if samples is not None:
            parts.append(f"{(samples - reused_samples) / elapsed:,.0f} samples/s")
        left = time_left(elapsed, done, total, (reused_done, reused_all))
        if left is not None:
            parts.append(f"ETA {duration(left)}")
        return ", ".join(parts)


class ProgressLine:
    """One line of progress on stderr, redrawn at most every `interval` seconds, shown only when enabled
    and the output is a terminal. `close` draws the latest state and ends the line."""

    def __init__(self, enabled: bool, interval: float = 0.25) -> None:
        self.enabled = enabled
        self.shown = enabled and sys.stdout.isatty() and sys.stderr.isatty()
        self.interval = interval
        self._last = 0.0
        self._width = 0
        self._pending: str | None = None

    def show(self, text: str, *, now: bool = False) -> None:
        """Show `text` as the line (later, at `close`, if it was redrawn less than `interval` ago)."""
        if not self.shown:
            return
        moment = time.monotonic()
        if not now and moment - self._last < self.interval:
            self._pending = text
            return
        self._last = moment
        self._draw(text)

    def _draw(self, text: str) -> None:
        sys.stderr.write("\r" + text.ljust(self._width))
        sys.stderr.flush()
        self._width, self._pending = len(text), None

    def note(self, text: str) -> None:
        """Print `text` on a line of its own (above the progress line, drawn again next time); also
        where the line is not shown (a log), unless progress is off."""
        if self.enabled:
            self.say(text)

    def say(self, text: str) -> None:
        """Print `text` on a line of its own, as `note` does, with progress off too."""
        sys.stderr.write(("\r" + text.ljust(self._width) if self.shown else text) + "\n")
        sys.stderr.flush()
        self._width = 0

    def close(self) -> None:
        if self._pending is not None:
            self._draw(self._pending)
        if self._width:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._width = 0


if __name__ == "__main__":  # `python -m prep.cli ...`, as `python -m prep ...`: one copy of this module runs
    import prep.cli

    prep.cli.main()
