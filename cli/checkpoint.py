"""`crossprobe checkpoint set-region-labels | set-temde | set-calibration`: a checkpoint with a chosen setting
(models/training/adopt.py); cli/__init__.py adds this group to the command line."""

from __future__ import annotations

from pathlib import Path

import typer

from crossprobe.cli.options import CKPT, command_line

checkpoint_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Write a checkpoint with a chosen setting (a new fingerprint: build indexes with it).",
)


@checkpoint_app.command("set-region-labels")
def set_region_labels(
    out: Path = typer.Option(..., help="directory for the new checkpoint (replaced atomically when it exists)"),
    ckpt: Path = CKPT,
    cp: float = typer.Option(0.0, help="CP's region weight w: logit + 20 * w * s_region (0: no region term)"),
    temde: float = typer.Option(0.0, help="T-EMDE's region weight w (0: no region term)"),
    pool: int = typer.Option(3, help="s_region = the mean of this many best-matching grid cells (1 to 49)"),
):
    """Write a checkpoint that adds region-level labels to the rerankers (all weights 0: off). Only the config
    changes. The dev sets chose --cp 0.2 --temde 0.3 --pool 3 (docs/research/bridge.md, "Region-level labels")."""
    from crossprobe.models import checkpoint
    from crossprobe.models.training.adopt import set_region_labels as run_set

    model, meta = checkpoint.load(ckpt)
    try:
        fp = run_set(model, meta, out, {"cp": cp, "temde": temde}, pool, {"command": command_line()})
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    state = f"weights {model.cfg.region.weights}, pool {model.cfg.region.pool}" if model.cfg.region.enabled else "off"
    typer.echo(f"{out}: fingerprint {fp} (from {meta['fingerprint']}; region labels {state})")


@checkpoint_app.command("set-temde")
def set_temde(
    trained: Path = typer.Argument(
        ...,
        help="the trained T-EMDE: `crossprobe train`'s RUN_DIR/temde.done.pt (or "
        "temde.m<i>.done.pt, one member) or a saved state dict (research/temde/sweep.py's "
        "<run-dir>/<variant>.weights.pt)",
    ),
    out: Path = typer.Option(..., help="directory for the new checkpoint (replaced atomically when it exists)"),
    ckpt: Path = CKPT,
):
    """Write a checkpoint with another trained T-EMDE in place of its own: its shape from its weights, its fusion
    weight with it; towers, bridge and the other rerankers unchanged. Train it on this checkpoint's towers."""
    from crossprobe.models import checkpoint
    from crossprobe.models.training.adopt import load_trained_temde
    from crossprobe.models.training.adopt import set_temde as run_set

    model, meta = checkpoint.load(ckpt)
    try:
        weights, report = load_trained_temde(trained)
        fp = run_set(model, meta, out, weights, {**(report or {}), "from": str(trained), "command": command_line()})
    except ValueError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    c = model.cfg.temde
    typer.echo(f"{out}: fingerprint {fp} (from {meta['fingerprint']}; T-EMDE N {c.N} x K {c.K}, inner {c.inner})")


@checkpoint_app.command("set-calibration")
def set_calibration(
    curves: Path = typer.Option(
        ...,
        help="`crossprobe calibrate --results FILE`'s FILE (or research/calibration/fit.py's "
        "docs/research/results/calibration.json)",
    ),
    ckpt: Path = CKPT,
):
    """Store relevance curves (one per rerank mode) in the checkpoint directory as calibration.json. The weights
    and fingerprint do not change, so no index is rebuilt; the service reads them at start-up."""
    import json

    from crossprobe.core import DEFAULT_CHECKPOINT, calibration, read_config
    from crossprobe.models.training.calibrate import served

    path = Path(ckpt or DEFAULT_CHECKPOINT)
    d = json.loads(curves.read_text())
    fp, want = read_config(path)["fingerprint"], d.get("meta", {}).get("fingerprint")
    if want != fp:
        typer.echo(
            f"{curves} was fitted for checkpoint {want}; {path} is {fp}: fit it again with --ckpt {path}", err=True
        )
        raise typer.Exit(2)
    try:
        cal = served(d)
    except (KeyError, ValueError) as e:
        typer.echo(f"{curves}: {e}", err=True)
        raise typer.Exit(2) from None
    cal.save(path)
    typer.echo(f"{path / calibration.FILE}: relevance curves for {', '.join(cal.curves)} (fingerprint {fp} unchanged)")
