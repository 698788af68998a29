"""The model stack's commands (typer), at the top level of `crossprobe`: train (also `--backbone`: reranker heads
on another model's backbone), eval (also `--data`: any model on a captioned folder), frontier, ablate, promote,
export, demo and fit-text-gate. They need PyTorch (the `torch` extra); cli/__init__.py adds them to the command line."""

from __future__ import annotations

from pathlib import Path

import typer

from crossprobe.cli.options import CKPT, MODELS_HELP, command_line, models_folder, need_flickr

app = typer.Typer(add_completion=False, no_args_is_help=True, help="crossprobe: text-to-image search models and tools")

_GRAPHS = typer.Option(None, "--graphs", "--models", help=MODELS_HELP)


@app.command()
def train(
    out: Path = typer.Option(
        None,
        help="where to write the checkpoint (default: models/checkpoints/default; with "
        "--backbone: artifacts/heads/<backbone fingerprint>)",
    ),
    run_dir: Path = typer.Option(
        None,
        help="resumable training state; run again to continue (default: runs/default; with --backbone: runs/heads)",
    ),
    cache_dir: Path = typer.Option(
        None, help="frozen-backbone feature cache (default: cache/flickr8k; with --backbone: cache/backbones)"
    ),
    tower_epochs: int = typer.Option(16, help="two-tower epochs (each: every training image once)"),
    gray: float = typer.Option(
        0.0, min=0.0, max=1.0, help="share of training images the towers see as their grayscale copy"
    ),
    methods: str = typer.Option("cp,temde,sm,tv", help="rerankers to train, comma separated"),
    reuse: str = typer.Option("", help="stages to take from --reuse-from instead of training them, e.g. towers,sm,tv"),
    reuse_from: Path = typer.Option(None, help="checkpoint whose stages --reuse takes (weights, report, wall time)"),
    refit_fusion: str = typer.Option(
        "", help="reused rerankers whose fusion weight is fit again on this run's dev banks"
    ),
    region: str = typer.Option(
        "",
        help="region-label weights inside the rerankers' training logit, e.g. cp=0.5,temde=0.5 "
        "(models/region_labels.py); empty: none",
    ),
    backbone: str = typer.Option(
        None,
        help="train Cross-probe and T-EMDE heads on this model's frozen backbone (a "
        "spec: hf:..., open_clip:...) instead of crossprobe's own model, on --data",
    ),
    data: Path = typer.Option(
        None,
        help="with --backbone: a captioned folder (images/ + captions.tsv with an optional "
        "split column; docs/models.md)",
    ),
    graphs: Path = _GRAPHS,
    heads: str = typer.Option(
        "",
        help="with --backbone: training settings and head shapes, e.g. "
        "epochs=12,lr=5e-4,cp.d=64,temde.N=40 (models/training/backbone_heads.py)",
    ),
    seed: int = 0,
    threads: int = 2,
):
    """Train towers and rerankers on Flickr8k (resumes from RUN_DIR when interrupted); with --backbone, reranker
    heads on another model's backbone over your own captioned folder."""
    if backbone is not None or data is not None:
        _train_heads(backbone, data, out, run_dir, cache_dir, models_folder(graphs), heads, seed, threads)
        return
    run_dir, cache_dir = run_dir or Path("runs/default"), cache_dir or Path("cache/flickr8k")
    need_flickr()
    from crossprobe.models import checkpoint
    from crossprobe.models.training.run import TrainConfig, seed_from_checkpoint
    from crossprobe.models.training.run import train as run_train

    stages = tuple(s for s in reuse.split(",") if s)
    if stages:
        if reuse_from is None:
            typer.echo("--reuse needs --reuse-from CHECKPOINT", err=True)
            raise typer.Exit(2)
        seed_from_checkpoint(reuse_from, run_dir, tuple(s for s in stages if not (run_dir / f"{s}.done.pt").exists()))
    from crossprobe.models.model import ModelConfig
    from crossprobe.models.region_labels import RegionConfig
    from crossprobe.models.training.towers import TowerTrainConfig

    try:
        weights = {m: float(w) for m, w in (kv.split("=", 1) for kv in region.split(",") if kv)}
        region_cfg = RegionConfig(weights=weights)
    except ValueError as e:
        typer.echo(f"--region {region!r}: expected METHOD=W,... with W >= 0 ({e})", err=True)
        raise typer.Exit(2) from e
    cfg = TrainConfig(
        seed=seed,
        threads=threads,
        cache_dir=cache_dir,
        run_dir=run_dir,
        out=out or checkpoint.DEFAULT_CHECKPOINT,
        towers=TowerTrainConfig(epochs=tower_epochs, gray=gray),
        model=ModelConfig(region=region_cfg),
        methods=tuple(m for m in methods.split(",") if m),
        refit_fusion=tuple(m for m in refit_fusion.split(",") if m),
    )
    run_train(cfg, log=typer.echo)


def _train_heads(
    backbone: str | None,
    data: Path | None,
    out: Path | None,
    run_dir: Path | None,
    cache_dir: Path | None,
    graphs: Path,
    settings: str,
    seed: int,
    threads: int,
) -> None:
    if not backbone or data is None:
        typer.echo("--backbone SPEC and --data FOLDER go together", err=True)
        raise typer.Exit(2)
    from crossprobe.core.inference import BadSpec, ModelUnavailable
    from crossprobe.models.training.backbone_heads import HeadsTrainConfig, train_heads, with_settings

    try:
        cfg = with_settings(
            HeadsTrainConfig(
                backbone,
                data,
                out,
                graphs,
                cache=cache_dir or Path("cache/backbones"),
                run_dir=run_dir or Path("runs/heads"),
                seed=seed,
                threads=threads,
                command=command_line(),
            ),
            settings,
        )
        report = train_heads(cfg, log=typer.echo)
    except (BadSpec, ModelUnavailable, ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo((Path(report["out"]) / "MODEL_CARD.md").read_text())


@app.command("eval")
def evaluate(
    ckpt: Path = CKPT,
    cache_dir: Path = typer.Option(Path("cache/flickr8k")),
    docs: Path = typer.Option(
        Path("artifacts/reports"),
        help="writes DOCS/flickr8k.md and DOCS/results/flickr8k.json (make eval: docs/research)",
    ),
    methods: str = typer.Option("cp,temde,sm,tv"),
    cp_all: bool = typer.Option(True, help="also score every caption x image pair with CP"),
    timing: bool = typer.Option(True, help="measure rerank ms per query (PyTorch and ONNX Runtime)"),
    card: bool = typer.Option(True, help="rewrite the committed checkpoint's MODEL_CARD.md from these results"),
    flickr: bool = typer.Option(True, help="the Flickr8k test protocol (--no-flickr: only the out-of-domain part)"),
    ood: bool = typer.Option(True, help="out-of-domain: coco-mini-dev among the Flickr8k dev images -> DOCS/ood.md"),
    baseline: Path = typer.Option(
        Path("artifacts/checkpoints/pre-bridge"),
        help="checkpoint the out-of-domain rows compare with (measured in the same run; the "
        "default, the model before the label bridge, is restored from git history by "
        "scripts/restore-checkpoint.sh pre-bridge)",
    ),
    threads: int = 2,
    data: Path = typer.Option(
        None,
        help="evaluate on this captioned folder instead (any model, through the serving "
        "code: models/evaluation/captioned.py); the Flickr8k options do not apply",
    ),
    model: str = typer.Option(
        None,
        envvar="CROSSPROBE_MODEL",
        help="with --data: the model spec (default: --ckpt, else the committed checkpoint)",
    ),
    split: str = typer.Option("test", help="with --data: train | dev | test | all"),
    k: int = typer.Option(100, min=1, help="with --data: the shortlist each reranker reorders"),
    graphs: Path = _GRAPHS,
    json_out: Path = typer.Option(None, "--json", help="with --data: also write the results to this file"),
):
    """Evaluate a checkpoint on the Flickr8k test split (text->image and image->text) and out of domain (coco-mini-dev);
    with --data, any model (--model SPEC) on a captioned folder: R@1/5/10 both ways, and each reranker's over the
    two-tower top K."""
    if data is not None:
        _eval_folder(
            data, model or (f"crossprobe:{ckpt}" if ckpt else None), split, k, models_folder(graphs), json_out, threads
        )
        return
    need_flickr()
    if ood and not (baseline / "config.json").exists():
        typer.echo(
            f"error: no baseline checkpoint at {baseline} for the out-of-domain rows: restore the default one "
            f"with scripts/restore-checkpoint.sh pre-bridge, pass --baseline CKPT, or run with --no-ood",
            err=True,
        )
        raise typer.Exit(2)
    import torch

    from crossprobe.models import checkpoint
    from crossprobe.models.demo import run_demo
    from crossprobe.models.evaluation import report
    from crossprobe.models.training.data import CachedData

    torch.set_num_threads(threads)
    model, meta = checkpoint.load(ckpt)
    data = CachedData.build(cache_dir, model.cfg.text.frozen_layers)
    j = None
    if flickr:
        res = report.evaluate(
            model, data, methods=tuple(m for m in methods.split(",") if m), cp_all=cp_all, timing=timing, log=typer.echo
        )
        j = report.write(res, docs, command_line(), meta["fingerprint"])
        typer.echo(report.markdown(j))
    demo = run_demo(None, None, 3, ckpt, echo=lambda *_: None, rerank=_served())
    o = _eval_ood(model, meta, data, baseline, demo, docs, cache_dir.parent / "coco-mini-dev") if ood else None
    if (
        ckpt is None and card and j is not None
    ):  # the committed checkpoint's card carries these metrics and the demo's answers
        from crossprobe.models.model_card import write_card

        write_card(checkpoint.DEFAULT_CHECKPOINT, j, demo, ood=o, rerank=_served())


def _eval_folder(
    data: Path, spec: str | None, split: str, k: int, graphs: Path, json_out: Path | None, threads: int
) -> None:
    import json

    from crossprobe.core import inference
    from crossprobe.models.data.captioned import CaptionedFolder
    from crossprobe.models.evaluation.captioned import evaluate as run_eval
    from crossprobe.models.evaluation.report import machine

    try:
        backend = inference.load(spec, inference.RuntimeOptions(graphs=graphs, threads=threads))
        res = run_eval(backend, CaptionedFolder.load(data), split, k)
    except (inference.BadSpec, inference.ModelUnavailable, ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    res = {
        "model": str(inference.parse(spec)),
        "fingerprint": backend.fingerprint,
        "data": str(data),
        "split": split,
        **res,
        "command": command_line(),
        "host": machine(),
    }
    text = json.dumps(res, indent=1)
    if json_out is not None:
        from crossprobe.core.atomic import atomic_write

        json_out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(json_out, text + "\n")
    typer.echo(text)


def _served() -> str:
    """The service's reranker for requests that name none: what the demo and the out-of-domain rows report."""
    from crossprobe.core import SERVED_RERANK

    return SERVED_RERANK


def _eval_ood(model, meta: dict, data, baseline: Path, demo: dict, docs: Path, cache: Path) -> dict | None:
    from crossprobe.models import checkpoint
    from crossprobe.models.data.captioned import CaptionedFolder, coco_root
    from crossprobe.models.demo import EXPECTED, run_demo
    from crossprobe.models.evaluation import ood
    from crossprobe.models.evaluation.report import machine

    if not CaptionedFolder.available(coco_root()):
        typer.echo(
            f"coco-mini-dev not found at {coco_root()} (set COCO_MINI_DEV_DIR); out-of-domain part skipped.", err=True
        )
        return None
    base_model, base_meta = checkpoint.load(baseline)
    feats = ood.OodFeatures(
        CaptionedFolder.load(coco_root()), cache, model.cfg.text.frozen_layers, data.grids[data.split_images("dev")]
    )
    served = _served()
    base_demo = run_demo(None, None, 3, baseline, echo=lambda *_: None, rerank=served)
    j = ood.to_json(
        ood.evaluate(base_model, feats),
        ood.evaluate(model, feats),
        "TT" if served == "none" else f"{served.upper()}@100",
        {
            "baseline_top1": ood.gallery_top1(base_demo, EXPECTED),
            "top1": ood.gallery_top1(demo, EXPECTED),
            "queries": len(EXPECTED),
        },
        command_line(),
        machine(),
        {"baseline": base_meta["fingerprint"], "default": meta["fingerprint"]},
    )
    ood.write(j, docs)
    typer.echo(ood.markdown(j))
    return j


@app.command()
def frontier(
    ckpt: Path = CKPT,
    run_dir: Path = typer.Option(
        Path("runs/default"), help="per-setting training state (frontier_<setting>.*); resumable"
    ),
    cache_dir: Path = typer.Option(Path("cache/flickr8k")),
    docs: Path = typer.Option(
        Path("artifacts/reports"),
        help="writes DOCS/frontier.md and DOCS/results/frontier.json (make frontier: docs/research)",
    ),
    seed: int = 0,
    threads: int = 2,
):
    """Train the CP settings of the latency/accuracy frontier on a checkpoint's towers and choose on dev (~51 min)."""
    need_flickr()
    from crossprobe.models.research.frontier import frontier as run_frontier
    from crossprobe.models.training.run import TrainConfig

    tcfg = TrainConfig(seed=seed, threads=threads, cache_dir=cache_dir, run_dir=run_dir)
    res = run_frontier(ckpt, docs, command_line(), tcfg, log=typer.echo)
    typer.echo(f"chosen: {res['chosen']} -> {docs / 'frontier.md'}")


@app.command()
def ablate(
    tower_epochs: int = typer.Option(
        0,
        help="tower options' budget; 0: the default's own (16 epochs, ~21 min "
        "each on 2 cores); N: a short budget, rows <option>@Nep against default@Nep",
    ),
    only: str = typer.Option("", help="comma-separated subset of options (default: all)"),
    run_dir: Path = typer.Option(Path("runs/ablation"), help="per-option training state and results; resumable"),
    cache_dir: Path = typer.Option(Path("cache/flickr8k")),
    docs: Path = typer.Option(
        Path("artifacts/reports"),
        help="writes DOCS/ablation.md and DOCS/results/ablation.json (make ablation: docs/research)",
    ),
    retime: bool = typer.Option(False, help="re-measure ms/query of every stored row on an otherwise idle machine"),
    seed: int = 0,
    threads: int = 2,
):
    """Train and measure every seed option (SEAM, ACE-RPE, ZoDIAC, T-EMDE pooling) against the default."""
    need_flickr()
    from crossprobe.models.research.ablation import OPTIONS, AblationConfig, Runner

    subset = tuple(o for o in only.split(",") if o)
    unknown = [o for o in subset if o not in OPTIONS]
    if unknown:
        typer.echo(f"unknown options {unknown}; choose from {list(OPTIONS)}", err=True)
        raise typer.Exit(2)
    cfg = AblationConfig(
        tower_epochs=tower_epochs or None,
        seed=seed,
        threads=threads,
        cache_dir=cache_dir,
        run_dir=run_dir,
        docs=docs,
        only=subset,
        command=command_line(),
    )
    Runner(cfg, log=typer.echo).run(retime=retime)


@app.command()
def promote(
    option: str = typer.Argument(..., help="a tower option whose ablation row beat the default"),
    out: Path = typer.Option(None, help="default: models/checkpoints/OPTION"),
    run_dir: Path = typer.Option(Path("runs/ablation")),
    cache_dir: Path = typer.Option(Path("cache/flickr8k")),
    seed: int = 0,
    threads: int = 2,
):
    """Make a winning tower option a checkpoint of its own: train its CP and T-EMDE, evaluate, write its card."""
    need_flickr()
    from crossprobe.models.research.ablation import OPTIONS, AblationConfig
    from crossprobe.models.training.promote import promote as run_promote

    if option not in OPTIONS:
        typer.echo(f"unknown option {option!r}; choose from {list(OPTIONS)}", err=True)
        raise typer.Exit(2)
    try:
        run_promote(
            option,
            AblationConfig(seed=seed, threads=threads, cache_dir=cache_dir, run_dir=run_dir, command=command_line()),
            out,
            log=typer.echo,
        )
    except (FileNotFoundError, ValueError) as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


@app.command()
def export(
    ckpt: Path = CKPT,
    out: Path = typer.Option(Path("artifacts/onnx"), help="root folder: the graphs go to <out>/<fingerprint>/"),
    int8_weights: str = typer.Option(
        "host",
        "--int8",
        help="the int8 query tower's formats: host (the one this CPU's kernels need), s8, u8 or both "
        "(graphs read by hosts of both kinds; 56 MB each: docs/research/int8_kernels.md)",
    ),
):
    """Export every ONNX graph the service and the indexer run: the checkpoint's graphs into <out>/<fingerprint>/
    (each checked against PyTorch), its int8 query tower, and the shared image backbone <out>/image_backbone.onnx.
    Point CROSSPROBE_MODELS_DIR at <out> and nothing exports at start."""
    from crossprobe.models import checkpoint, graphs
    from crossprobe.models import export as ex
    from crossprobe.models.evaluation.timing import parity

    # what is served: the towers, CP, T-EMDE and the explain map, never the research-only SM / TV references
    model, meta = checkpoint.load(ckpt, references=False)
    folder = ex.ensure_graphs(out, ex.SERVICE_GRAPHS, model=model, fingerprint=meta["fingerprint"])
    inputs = graphs.example_inputs(model)
    for name in ex.SERVICE_GRAPHS:
        path = folder / f"{name}.onnx"
        diff = parity(model, name, path, inputs[name])
        typer.echo(f"{path}  max|ORT - PyTorch| = {diff:.2e}")
        if diff > 1e-4:
            raise typer.Exit(1)
    formats = {"host": (None,), "s8": ("s8",), "u8": ("u8",), "both": ("s8", "u8")}.get(int8_weights)
    if formats is None:
        raise typer.BadParameter(f"--int8 {int8_weights}: host, s8, u8 or both")
    for weights in formats:
        typer.echo(ex.ensure_int8_query(folder, weights))
    typer.echo(ex.ensure_backbone(out))


@app.command()
def demo(
    images: Path = typer.Option(None, envvar="IMAGES", help="folder of images (default: scikit-image's sample photos)"),
    query: list[str] = typer.Option(None, "--query", "-q", help="queries (default: a few built-in ones)"),
    top: int = 3,
    ckpt: Path = CKPT,
    rerank: str = typer.Option(None, help="cp | temde | none (default: the service's default reranker)"),
):
    """Encode a small gallery and print the top images for a few queries."""
    from crossprobe.models.demo import run_demo

    run_demo(images, query or None, top, ckpt, echo=typer.echo, rerank=rerank or _served())


@app.command("fit-text-gate")
def fit_text_gate(
    out: Path = typer.Option(None, help="where to write the gate (default: models/checkpoints/text_gate)"),
    workdir: Path = typer.Option(
        Path("artifacts/text-gate"), help="generated sets, OCR and grid caches (kept: a rerun takes seconds)"
    ),
    real: int = typer.Option(2000, help="train photos whose real writing full OCR reads (0: none)"),
    documents: int = typer.Option(400, help="generated train documents and screens (0: none)"),
    l2: float = typer.Option(0.1, help="L2 weight of the logistic regression"),
    pass_pct: float = typer.Option(
        None,
        "--pass",
        min=0.0,
        max=100.0,
        help="the threshold: this % of the dev "
        "photos without a sign pass (default: as many as the detector gate passes)",
    ),
):
    """Fit the text gate that decides which photos OCR reads (core/text_gate.py): a probe over each cell of the
    backbone's grid, trained on Flickr8k train photos, its threshold chosen on dev (needs the ocr extra)."""
    need_flickr()
    import importlib.util

    if (
        importlib.util.find_spec("rapidocr_onnxruntime") is None
    ):  # full OCR finds the real writing, its detector the threshold
        typer.echo("the text gate's fit reads photos with rapidocr: pip install 'crossprobe[ocr]'", err=True)
        raise typer.Exit(2)
    from crossprobe.core.text_gate import DEFAULT_GATE
    from crossprobe.models.training.text_gate import GateFitConfig
    from crossprobe.models.training.text_gate import fit_text_gate as run_fit
    from crossprobe.models.training.text_gate_sets import missing_fonts

    if missing_fonts():  # the sets would be drawn otherwise than the served gate's: refuse rather than differ
        typer.echo(
            f"the generated signs and documents are drawn with fonts this machine lacks: {missing_fonts()} "
            "(Debian: apt-get install fonts-dejavu-core fonts-liberation)",
            err=True,
        )
        raise typer.Exit(2)

    cfg = GateFitConfig(workdir=workdir, real=real, documents=documents, l2=l2, pass_pct=pass_pct)
    run_fit(cfg, out or DEFAULT_GATE, command_line(), log=typer.echo)
