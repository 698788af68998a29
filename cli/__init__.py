"""The command line: the layer above the batch jobs and the service (the only code that imports both).

The `crossprobe` command (typer): one app, one module per command group:
- stack.py: the model stack's commands at the top level (train, eval, frontier, ablate, promote, export, demo,
  fit-text-gate; they need PyTorch);
- checkpoint.py (`crossprobe checkpoint ...`), models.py (`crossprobe models export | list | pull`), data.py
  (`crossprobe data convert ...`), index.py (`crossprobe index ...`, the batch jobs);
- here: serve, demo-service and calibrate (it runs both the batch jobs and the service: calibrate.py).
Each command imports what it runs when it runs, so `crossprobe --help` stays instant and the torch-free commands
never import PyTorch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

# the libraries crossprobe runs never download by themselves: crossprobe.core.hub does, where a model is named
# that this machine lacks, and keeps a user's own HF_HUB_OFFLINE=1 (recorded here before it is set for them)
from crossprobe.core import hub  # noqa: E402 (light: os and socket only)

hub.remember_user_offline()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from crossprobe.cli import backup as _backup  # noqa: E402, F401 (registers `index backup` and `index restore`)
from crossprobe.cli.checkpoint import checkpoint_app  # noqa: E402 (after the variables the libraries read)
from crossprobe.cli.data import data_app  # noqa: E402
from crossprobe.cli.index import index_app  # noqa: E402
from crossprobe.cli.models import models_app  # noqa: E402
from crossprobe.cli.options import CKPT, command_line  # noqa: E402
from crossprobe.cli.stack import app as stack_app  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True, help="crossprobe: text-to-image search models and tools")
app.add_typer(stack_app)  # no name: its commands sit at the top level (crossprobe train, crossprobe eval, ...)
app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(models_app, name="models")
app.add_typer(data_app, name="data")
app.add_typer(index_app, name="index")


def _device(value: str | None) -> str | None:
    """--device as the settings spell it (cpu, cuda, cuda:N, auto), or a usage error naming the choices."""
    if value is None:
        return None
    from crossprobe.core.inference import resolve_device

    value = value.strip().lower()
    if value != "auto":  # auto is resolved at start-up (it probes ONNX Runtime)
        try:
            resolve_device(value)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
    return value


@app.command()
def serve(
    host: str = typer.Option(None, help="bind address (default 127.0.0.1, env CROSSPROBE_HOST)"),
    port: int = typer.Option(None, help="port (default 8000, env CROSSPROBE_PORT)"),
    model: str = typer.Option(
        None,
        help="the model, a spec: crossprobe:<checkpoint dir>, open_clip:<arch>/<weights>, "
        "hf:<repo or dir>, immich:<folder> (env CROSSPROBE_MODEL; default: the committed "
        "checkpoint); it must be the model the served indexes were built with",
    ),
    ckpt: Path = typer.Option(
        None, help="a crossprobe checkpoint directory: the older form of --model crossprobe:<dir> (env CROSSPROBE_CKPT)"
    ),
    index: str = typer.Option(None, "--index", help="comma-separated indexes to serve (env CROSSPROBE_INDEXES)"),
    device: str = typer.Option(
        None,
        callback=_device,
        help="cpu | cuda | cuda:N | auto: where the model and the ANN search run (env "
        "CROSSPROBE_DEVICE; default auto: cuda where ONNX Runtime has its CUDA provider, "
        "else cpu). A GPU asked for and not there: start-up fails, /readyz says why",
    ),
    images: Path = typer.Option(
        None,
        help="a folder of photos to search: indexed first (built on first use, else brought up to date), served "
        "as the default index, and kept in step while the service runs (see --watch)",
    ),
    name: str = typer.Option(None, help="with --images: the index's name (default: the folder's name)"),
    watch: bool = typer.Option(True, help="with --images: follow the folder's changes while serving"),
):
    """Serve text-to-image search over HTTP (settings: CROSSPROBE_* env vars, see docs/configuration.md). With
    --images, one command from a folder to its search page: `crossprobe serve --images ~/Pictures --model SPEC`."""
    from pydantic import ValidationError

    from crossprobe.service.server import serve as run_server
    from crossprobe.service.settings import Settings

    over: dict[str, Any] = {
        k: v for k, v in {"host": host, "port": port, "indexes": index, "device": device}.items() if v is not None
    }
    if model is not None or ckpt is not None:  # a flag names the model: the environment's model variables do not
        over.update(model=model, ckpt=ckpt)
    sync = None
    try:
        if images is not None:
            sync = _folder_sync(images, name, over, watch)
            over.setdefault("default_index", sync.watcher.name)
        settings = Settings(**over)
    except ValidationError as e:  # a bad spec, --model and CROSSPROBE_CKPT at odds: a usage error, not a traceback
        typer.echo(
            "error: " + "; ".join(f"{'.'.join(map(str, er['loc'])) or 'settings'}: {er['msg']}" for er in e.errors()),
            err=True,
        )
        raise typer.Exit(2) from None
    if sync is not None:
        typer.echo(f"search page: http://{_shown(settings.host)}:{settings.port}/ (index {sync.watcher.name!r})")
    try:
        run_server(settings)
    finally:
        if sync is not None:
            sync.stop()


def _shown(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host


def _folder_sync(images: Path, name: str | None, over: dict, watch: bool):
    """The folder's index made current before the service starts (cli/folder.py); exit 2 with the reason where it
    cannot be (no such folder, an index of that name built from another folder, a model that cannot be had)."""
    from redis.exceptions import RedisError

    from crossprobe.cli.folder import FolderSync, folder_index
    from crossprobe.indexer.jobs.settings import IndexerSettings

    try:
        jobs = IndexerSettings(**{k: over[k] for k in ("model", "ckpt", "device") if k in over})
        sync = FolderSync(folder_index(images, name), images, jobs, say=typer.echo)
        sync.start()
    except (ValueError, LookupError, RuntimeError, OSError, RedisError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    if watch:
        sync.watch()
    return sync


@app.command("demo-service")
def demo_service(
    images: Path = typer.Option(None, envvar="IMAGES", help="folder of images (default: scikit-image's sample photos)"),
    query: list[str] = typer.Option(None, "--query", "-q", help="queries (default: a few built-in ones)"),
    top: int = 3,
    rerank: str = typer.Option(None, help="cp | temde | none (default: the service's default reranker)"),
    ckpt: Path = CKPT,
    workdir: Path = typer.Option(Path("artifacts/demo-service"), help="gallery, index and embedded Redis go here"),
):
    """Index a gallery, start the HTTP service with an embedded Redis, query it over HTTP, stop it."""
    from crossprobe.cli.demo import run_service_demo

    try:
        run_service_demo(images, query or None, top, ckpt, rerank, workdir, echo=typer.echo)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None


@app.command()
def calibrate(
    ckpt: Path = CKPT,
    workdir: Path = typer.Option(
        Path("artifacts/calibration"), help="the dev indexes and the served scores (cached per checkpoint)"
    ),
    limit: int = typer.Option(None, help="first N captions of each dev set (default: all)"),
    refresh: bool = typer.Option(False, help="query again even if the scores are cached"),
    results: Path = typer.Option(
        None,
        help="also write the whole analysis as JSON (shift sweep, ECE, reliability, "
        "absent-query cutoffs), e.g. docs/research/results/calibration.json",
    ),
):
    """Fit a checkpoint's relevance curves (one per rerank mode) on the two dev sets' served results and store
    them beside its weights as calibration.json (models/training/calibrate.py). The fingerprint does not change:
    no index is rebuilt. Needs Flickr8k and coco-mini-dev."""
    import json

    from crossprobe.cli.calibrate import fit_calibration
    from crossprobe.core import DEFAULT_CHECKPOINT
    from crossprobe.models.training.calibrate import served

    path = Path(ckpt or DEFAULT_CHECKPOINT)
    try:
        out = fit_calibration(path, workdir, limit, refresh, command_line(), log=typer.echo)
    except FileNotFoundError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    if results:
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(json.dumps(out, indent=1))
    cal = served(out)
    cal.save(path)
    typer.echo(f"{path / 'calibration.json'}: relevance curves for {', '.join(cal.curves)}; ECE top-10 {out['ece']}")


if __name__ == "__main__":
    app()
