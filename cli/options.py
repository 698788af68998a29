"""What several command groups share: the checkpoint option, the command line as run (recorded in what a
command writes), and the Flickr8k check of the commands that train or evaluate on it."""

from __future__ import annotations

import shlex
import sys

import typer

CKPT = typer.Option(None, help="checkpoint directory (default: the committed one)")


def command_line() -> str:
    return "crossprobe " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def need_flickr() -> None:
    from crossprobe.models.data.flickr8k import available, dataset_root

    if not available():
        typer.echo(f"Flickr8k not found at {dataset_root()} (set FLICKR8K_DIR); nothing to do.", err=True)
        raise typer.Exit(2)
