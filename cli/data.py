"""`crossprobe data convert coco | karpathy`: captioned folders (models/data/captioned.py's layout) from published
caption files (models/data/convert.py). cli/__init__.py adds this group to the command line."""

from __future__ import annotations

from pathlib import Path

import typer

data_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help='Image-caption folders: images/ + captions.tsv (docs/models.md, "Train rerankers on your own data")',
)
convert_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Write a captioned folder from a published caption file (added to the folder's captions.tsv when it has one).",
)
data_app.add_typer(convert_app, name="convert")
_IMAGES = typer.Option(..., help="the folder holding the images the file names")
_OUT = typer.Option(..., help="the captioned folder to write (images/ + captions.tsv)")
_LINK = typer.Option(True, "--link/--copy", help="link the images (symbolic links, the default) or copy them")


@convert_app.command("coco")
def convert_coco(
    captions: Path = typer.Argument(..., help="COCO's annotations/captions_<split><year>.json"),
    images: Path = _IMAGES,
    out: Path = _OUT,
    split: str = typer.Option("train", help="the split of every caption in this file: train | dev | test"),
    link: bool = _LINK,
):
    """COCO captions JSON (images [{id, file_name}], annotations [{image_id, caption}]) -> a captioned folder."""
    from crossprobe.models.data import convert

    _converted(lambda: convert.from_coco(captions, images, out, split, link))


@convert_app.command("karpathy")
def convert_karpathy(
    dataset: Path = typer.Argument(..., help="dataset_coco.json, dataset_flickr30k.json or dataset_flickr8k.json"),
    images: Path = _IMAGES,
    out: Path = _OUT,
    link: bool = _LINK,
):
    """Karpathy-split JSON -> a captioned folder (train and restval -> train, val -> dev, test -> test)."""
    from crossprobe.models.data import convert

    _converted(lambda: convert.from_karpathy(dataset, images, out, link))


def _converted(run) -> None:
    """Run a conversion and print its report; a file that cannot be read is a usage error (exit 2), a conversion
    that adds nothing where nothing was before a failure (exit 1)."""
    try:
        report = run()
    except ValueError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(report.summary())
    if not report.kept and not sum(report.captions.values()) and not report.already:
        raise typer.Exit(1)
