"""Write a checkpoint with a chosen setting: the settings the dev-set sweeps choose (research/region_labels,
research/temde) become part of a checkpoint here, through `crossprobe checkpoint set-region-labels` and
`crossprobe checkpoint set-temde`.

Each function changes a loaded checkpoint's model in place and saves it to a new directory: every other stage keeps
its weights, the config and the record in config.json say what changed, and the new checkpoint has a new
fingerprint (an index built with the old one must be rebuilt before the service serves it with the new one).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from crossprobe.models import checkpoint
from crossprobe.models.region_labels import RegionConfig
from crossprobe.models.temde import Temde

REGION_METHODS = ("cp", "temde")  # the rerankers whose scorer graphs add the region term (graphs.region_inputs)


def _extra(meta: dict) -> dict:
    """config.json's records other than the model config and its fingerprint (save() writes those again)."""
    return {k: v for k, v in meta.items() if k not in ("model", "fingerprint")}


def set_region_labels(
    model, meta: dict, dest: Path, weights: dict[str, float], pool: int = 3, record: dict | None = None
) -> str:
    """Save `model` (loaded with `meta`) to dest with region labels weighted `weights` (reranker -> w in
    logit + SCALE * w * s_region; 0 or missing: no region term for that reranker) and `pool` best cells
    (region_labels.py). No weight above 0 switches region labels off. config.json records the setting and the
    source checkpoint's fingerprint under "region_labels", with `record` (e.g. how it was chosen). -> the new
    fingerprint."""
    unknown = sorted(set(weights) - set(REGION_METHODS))
    if unknown:
        raise ValueError(f"region labels weight the rerankers {list(REGION_METHODS)}, not {unknown}")
    RegionConfig(
        weights={m: float(w) for m, w in weights.items()}, pool=pool
    )  # raises on w < 0 or a pool outside 1..49
    cfg = RegionConfig(weights={m: float(w) for m, w in weights.items() if w > 0}, pool=pool)
    if cfg.enabled and not model.bridge.cfg.enabled:
        raise ValueError("the checkpoint has no label bridge: its class table is what the cells are matched against")
    model.cfg.region = cfg
    extra = _extra(meta)
    extra["region_labels"] = {
        "source_checkpoint": meta["fingerprint"],
        "weights": cfg.weights,
        "pool": cfg.pool,
        **(record or {}),
    }
    return checkpoint.save(model.eval(), dest, extra)


def load_trained_temde(path: Path) -> tuple[dict[str, torch.Tensor], dict | None]:
    """A trained T-EMDE on disk -> (its state dict, its training report or None): `crossprobe train`'s
    <run-dir>/temde.done.pt or temde.m<i>.done.pt ({"weights", "report"}), or a bare state dict
    (torch.save(temde.state_dict()), e.g. research/temde/sweep.py's <run-dir>/<variant>.weights.pt)."""
    obj = torch.load(Path(path), map_location="cpu", weights_only=False)
    if isinstance(obj, dict) and isinstance(obj.get("weights"), dict):
        return obj["weights"], obj.get("report")
    if isinstance(obj, dict) and "centroids" in obj:
        return obj, None
    raise ValueError(f"{path}: neither a T-EMDE state dict nor a training stage file with its weights")


def set_temde(
    model,
    meta: dict,
    dest: Path,
    weights: dict[str, torch.Tensor],
    report: dict | None = None,
    recipe: dict | None = None,
    train_s: float | None = None,
) -> str:
    """Save `model` (loaded with `meta`) to dest with the T-EMDE whose state dict is `weights` (fusion weight
    included) in place of its own; its shape (N partitions x K centroids, inner dims) comes from the weights, its
    other settings from the checkpoint's T-EMDE. The training record: `report` replaces training["temde"] (with the
    source checkpoint's fingerprint), `recipe` (epochs, pretrain_epochs, captions_per_image) and `train_s` update the
    recorded
    budget and wall time. -> the new fingerprint."""
    if "centroids" not in weights:
        raise ValueError("not a T-EMDE state dict (no centroids)")
    N, K, inner = weights["centroids"].shape
    cfg = dataclasses.replace(model.cfg.temde, N=int(N), K=int(K), inner=int(inner))
    temde = Temde(cfg)
    try:
        temde.load_state_dict(weights)
    except RuntimeError as e:
        raise ValueError(f"the T-EMDE does not fit this checkpoint's T-EMDE settings {cfg}: {e}") from e
    model.temde, model.cfg.temde = temde, cfg
    extra = _extra(meta)
    training = extra.setdefault("training", {})
    training["temde"] = {**(report or {}), "source_checkpoint": meta["fingerprint"]}
    tc = training.get("train_config")
    if tc is not None:
        tc.setdefault("model", {})["temde"] = dataclasses.asdict(cfg)
        if recipe:
            for key, field in (
                ("epochs", "epochs_by_method"),
                ("pretrain_epochs", "pretrain_by_method"),
                ("captions_per_image", "captions_by_method"),
            ):
                if key in recipe:
                    tc.setdefault(field, {})["temde"] = recipe[key]
            if "members_by_method" in tc:
                tc["members_by_method"]["temde"] = 1  # one trained T-EMDE, not a merge of seeds
    if train_s is not None:
        training.setdefault("timings_s", {})["temde"] = train_s
    return checkpoint.save(model.eval(), dest, extra)
