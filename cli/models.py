"""`crossprobe models export | list | pull`: the model families' folders (models/families/, core/inference/).

    crossprobe models export SPEC [--out DIR]   the folder <DIR>/<fingerprint>/ the service and the jobs run torch-free
    crossprobe models list [--root DIR]         what is exported there
    crossprobe models pull SPEC                 fetch the weights where a network exists (says what to do where not)

DIR defaults to the models folder the service and the index commands read (CROSSPROBE_MODELS_DIR, else
<index root>/_models). cli/__init__.py adds this group to the command line."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from crossprobe.cli.options import MODELS_HELP, models_folder

models_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="model families: export a model's graphs, list the exported ones, pull weights",
)


def _root():
    return typer.Option(None, "--root", "--out", help=MODELS_HELP)


@models_app.command("export")
def export(
    spec: str = typer.Argument(..., help="open_clip:<arch>/<tag or file> | hf:<repo id or dir>"), out: Path = _root()
):
    out = models_folder(out)
    """Export SPEC's graphs, tokenizer and model.json into <out>/<fingerprint>/ (kept if it exists), checked against
    the family's own library. Needs PyTorch and the family's library (pip install 'crossprobe[torch,export]' for
    Hugging Face models, 'crossprobe[open_clip]' for open_clip and M-CLIP ones). `crossprobe serve --model SPEC`
    and the index commands do this themselves on first use."""
    from crossprobe.core.inference.spec import BadSpec

    try:
        from crossprobe.models import families

        folder = families.export(spec, out, log=typer.echo)
    except ImportError as e:
        typer.echo(
            f"{spec}: this environment cannot export it ({e}). Hugging Face models export where PyTorch and "
            f"transformers are installed (pip install 'crossprobe[torch,export]'); open_clip and M-CLIP models "
            f"where open_clip is too (pip install 'crossprobe[open_clip]')",
            err=True,
        )
        raise typer.Exit(2) from None
    except (BadSpec, FileNotFoundError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    except (ValueError, RuntimeError) as e:  # TokenizerMismatch, a graph that differs from PyTorch
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    meta = json.loads((folder / "model.json").read_text(encoding="utf-8"))
    typer.echo(f"{folder}\nfingerprint {meta['fingerprint']} ({meta['family']}, d {meta['dims']['d']})")


@models_app.command("list")
def list_models(root: Path = _root()):
    """The exported models under ROOT: fingerprint, family, spec(s), dims, size on disk."""
    root = models_folder(root)
    rows = []
    for mj in sorted(root.glob("*/model.json")) if root.is_dir() else []:
        try:
            m = json.loads(mj.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # not one of ours
        size = sum(f.stat().st_size for f in mj.parent.rglob("*") if f.is_file())
        d = m.get("dims", {})
        dims = f"d {d.get('d')} grid {'x'.join(map(str, d.get('grid', [])))} text {d.get('text_width')}"
        specs = ", ".join([m.get("spec", "?"), *(m.get("aliases") or {})])
        rows.append(
            (m.get("fingerprint", mj.parent.name), m.get("family", "?"), specs, dims, f"{size / 2**20:.1f} MiB")
        )
    if not rows:
        typer.echo(f"no exported models under {root} (`crossprobe models export SPEC --out {root}`)")
        return
    head = ("fingerprint", "family", "spec", "dims", "size")
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


@models_app.command("pull")
def pull(
    spec: str = typer.Argument(..., help="hf:<repo id> | open_clip:<arch>/<tag> | immich:<repo id>"),
    timeout: float = typer.Option(10.0, min=0.1, help="seconds to wait for the hub (each connection)"),
):
    """Download SPEC's files (the Hugging Face cache, open_clip's cache) where a network exists; where none does,
    say so within TIMEOUT seconds and what to do instead."""
    from crossprobe.core.hub import NoNetwork
    from crossprobe.core.inference.spec import BadSpec
    from crossprobe.models.families.pull import pull as run_pull

    try:
        use = run_pull(spec, timeout, log=typer.echo)
    except NoNetwork as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(3) from None
    except (BadSpec, FileNotFoundError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    except Exception as e:  # the hub answered, then the download failed (no such repo, a cut connection): say it
        typer.echo(f"{spec}: download failed: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(
        f"pulled: use {use} (then `crossprobe models export {use}`)"
        if not use.startswith("immich:")
        else f"pulled: use {use}"
    )
