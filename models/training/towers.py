"""Stage 1: train the two towers (TT) on cached backbone features.

One epoch = every training image once, paired with one of its 5 captions drawn
at random (so images in a batch are distinct and in-batch negatives are true
negatives). Feature-level augmentation: horizontal flip of the 7x7 grid, and (gray > 0)
the grid of the photo's grayscale copy in place of its own for that share of the images.
The best epoch on the dev split (rsum of TT) is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from crossprobe.core import inputs
from crossprobe.models.evaluation import retrieval
from crossprobe.models.losses import info_nce, order_hinge, vsepp_max_violation
from crossprobe.models.model import SearchModel
from crossprobe.models.training.data import CachedData
from crossprobe.models.training.state import EpochState


@dataclass
class TowerTrainConfig:
    epochs: int = 16
    batch: int = 128
    lr: float = 5e-4
    lr_text: float = 5e-5  # fine-tuned MiniLM layers
    weight_decay: float = 0.02
    warmup_steps: int = 100
    loss: str = "infonce+vsepp"  # any of infonce, vsepp, order joined by '+'
    vsepp_weight: float = 1.0
    order_weight: float = 1.0  # SEAM's order-embedding hinge, when "order" is in `loss`
    hflip: float = 0.5
    # share of training images seen as their grayscale copy (cached grids, CachedData.with_gray): the towers were
    # found to read colour where captions do not name it; measured, not adopted (docs/research/region_labels.md,
    # section 4)
    gray: float = 0.0
    pool_penalty: float = 0.1  # SEAM diversity penalty weight (only active with pool_hops > 1)

    def __post_init__(self):
        unknown = set(self.loss.split("+")) - {"infonce", "vsepp", "order"}
        if unknown:
            raise ValueError(f"unknown tower loss terms {sorted(unknown)} in {self.loss!r}")


def hflip_grid(grid: torch.Tensor) -> torch.Tensor:
    """(B, 49, C) row-major 7x7 grid -> left-right mirrored grid."""
    B, N, C = grid.shape
    return grid.view(B, inputs.GRID, inputs.GRID, C).flip(2).reshape(B, N, C)


def length_bucketed_batches(
    data: CachedData, images: np.ndarray, batch: int, rng
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every image once with one random caption, in batches of similar caption
    length (shuffled batch order): padding to the batch's longest caption then
    costs little, which cut the text side's share of a step roughly in half."""
    caps = np.array([rng.choice(data.image_captions[i]) for i in images])
    lengths = data.masks[caps].sum(1) + rng.random(len(caps))  # random tie-break inside a length
    order = np.argsort(lengths)
    chunks = [order[s : s + batch] for s in range(0, len(order), batch)]
    rng.shuffle(chunks)
    return [(images[c], caps[c]) for c in chunks]


def cosine_schedule(opt, total: int, warmup: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(opt, f)


def tower_parameters(model: SearchModel):
    text_top = [p for p in model.text.top.parameters()]
    ids = {id(p) for p in text_top}
    rest = [
        p
        for n, p in model.named_parameters()
        if (n.startswith(("text.", "vision.")) or n == "logit_scale") and id(p) not in ids and p.requires_grad
    ]
    return text_top, rest


def tower_loss(model: SearchModel, cfg: TowerTrainConfig, states, mask, grid) -> torch.Tensor:
    t = model.text.forward_states(states, mask)
    v = model.vision(grid)
    loss = torch.zeros(())
    if "infonce" in cfg.loss:
        loss = loss + info_nce(t.g, v.g, model.logit_scale)
    if "vsepp" in cfg.loss:
        loss = loss + cfg.vsepp_weight * vsepp_max_violation(t.g, v.g)
    if "order" in cfg.loss:
        loss = loss + cfg.order_weight * order_hinge(t.g, v.g)
    if model.cfg.text.pool_hops > 1:
        loss = loss + cfg.pool_penalty * model.text.pool.penalty
    return loss


def train_towers(model: SearchModel, data: CachedData, cfg: TowerTrainConfig, state_path, seed: int, log=print) -> dict:
    text_top, rest = tower_parameters(model)
    opt = torch.optim.AdamW(
        [{"params": text_top, "lr": cfg.lr_text}, {"params": rest, "lr": cfg.lr}], weight_decay=cfg.weight_decay
    )
    train_imgs = np.asarray(data.split_images("train"))
    steps_per_epoch = math.ceil(len(train_imgs) / cfg.batch)
    sched = cosine_schedule(opt, cfg.epochs * steps_per_epoch, cfg.warmup_steps)
    state = EpochState(state_path, "model")
    start, best, history = state.resume(
        lambda w: model.load_state_dict(w, strict=False), opt, sched, {"rsum": -1.0}, "towers", log
    )
    for epoch in range(start, cfg.epochs):
        rng = np.random.default_rng(seed + epoch)  # per-epoch stream: resume reproduces the same batches
        model.train()
        batches = length_bucketed_batches(data, train_imgs, cfg.batch, rng)
        total = 0.0
        for imgs, caps in tqdm(batches, desc=f"towers epoch {epoch + 1}/{cfg.epochs}", leave=False):
            states, mask = data.text_batch(caps)
            grid = torch.from_numpy(data.grids[imgs]).float()
            if cfg.gray > 0:  # drawn only when on, so runs without it keep their random stream
                assert data.gray_grids is not None  # loaded by run.train (CachedData.with_gray) when gray > 0
                g = (torch.rand(len(imgs)) < cfg.gray).numpy()
                grid[g] = torch.from_numpy(data.gray_grids[imgs[g]]).float()
            flip = torch.rand(len(imgs)) < cfg.hflip
            grid[flip] = hflip_grid(grid[flip])
            loss = tower_loss(model, cfg, states, mask, grid)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 2.0)
            opt.step()
            sched.step()
            total += loss.item()
        model.eval()
        dev = retrieval.evaluate_tt(model, data, "dev")
        rec = {
            "epoch": epoch + 1,
            "loss": total / steps_per_epoch,
            "dev_rsum": dev["rsum"],
            "dev_t2i_R@1": dev["t2i"]["R@1"],
        }
        history.append(rec)
        log(f"towers {rec}")
        if dev["rsum"] > best["rsum"]:
            best = {
                "rsum": dev["rsum"],
                "epoch": epoch + 1,
                "weights": {k: v.clone() for k, v in model.tower_state_dict().items()},
            }
        state.save(model.tower_state_dict(), opt, sched, epoch + 1, best, history)
    model.load_state_dict(best["weights"], strict=False)
    return {"best_epoch": best["epoch"], "dev_rsum": best["rsum"], "history": history}
