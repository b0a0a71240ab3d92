"""The `shardprep` command line: a click group whose commands are thin shells over the prep modules.

Each command module is imported only when its command runs, so `shardprep --help` stays fast.
"""

from __future__ import annotations

import importlib
import sys

import click

from prep import __version__
from prep.errors import PrepError

# name -> "module:attribute" of a click command. Commands register here, one line each.
COMMANDS: dict[str, str] = {
    "prepare": "prep.prepare_cli:prepare_command",
    "mount": "prep.mount_cli:mount_command",
    "umount": "prep.mount_cli:umount_command",
    "info": "prep.info_cli:info_command",
    "verify": "prep.verify_cli:verify_command",
    "preview": "prep.preview_cli:preview_command",
    "write": "prep.write_cli:write_command",
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
