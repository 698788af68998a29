"""What several command groups share: the checkpoint option, the command line as run (recorded in what a
command writes), and the Flickr8k check of the commands that train or evaluate on it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer

CKPT = typer.Option(None, help="checkpoint directory (default: the committed one)")
MODELS_HELP = (
    "the models folder, <folder>/<fingerprint>/ (env CROSSPROBE_MODELS_DIR; default <index root>/_models, the one "
    "the service and the index commands read)"
)


def models_folder(given: Path | None) -> Path:
    """--models as given, else the settings' models folder (StorageSettings.models: the service's and the jobs')."""
    if given is not None:
        return given
    from crossprobe.storage.settings import StorageSettings

    return StorageSettings().models


def command_line() -> str:
    return "crossprobe " + " ".join(shlex.quote(a) for a in sys.argv[1:])


def need_flickr() -> None:
    from crossprobe.models.data.flickr8k import available, dataset_root

    if not available():
        typer.echo(f"Flickr8k not found at {dataset_root()} (set FLICKR8K_DIR); nothing to do.", err=True)
        raise typer.Exit(2)
