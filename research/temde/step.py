"""Time of one T-EMDE listwise training step, the coder's distance form vs its matmul form.

    python -m research.temde.step [--steps 6] [--out docs/research/results/temde_step.json]

The step is what train_reranker does per batch for T-EMDE on the backbone features: 32 captions (20 MiniLM
states of 384) against 16 candidates each (512 Lite0 grids of 49 x 1280), both coders, sketches, the score,
listwise cross-entropy, backward, AdamW. Random inputs (the cost does not depend on their values). "distance"
materialises the (B*T, N, K, inner) differences as models/temde.py did before; "matmul" is TemdeCoder now.
Median of --steps after one warm-up step, on torch's intra-op threads (2 here). Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from crossprobe.models.evaluation.report import machine
from crossprobe.models.temde import Temde, TemdeConfig

SHAPES = ((20, 8, 8), (32, 16, 8), (64, 16, 8))  # (N, K, inner): the default and the sweep's larger sketches


def distance_form(coder, x: torch.Tensor) -> torch.Tensor:
    """The coder as it was: softmax of -||z - c||^2 / tau with the differences materialised."""
    B, T, _ = x.shape
    z = coder.bn(coder.lin(x).reshape(B * T, -1)).view(B, T, coder.cfg.N, 1, coder.cfg.inner)
    return (-((z - coder.centroids) ** 2).sum(-1) / coder.log_tau.exp()).softmax(-1)


def step_times(N: int, K: int, inner: int, form: str, steps: int) -> list[float]:
    torch.manual_seed(0)
    m = Temde(TemdeConfig(N=N, K=K, inner=inner, inputs="backbone")).train()
    code = (lambda c, x: c(x)) if form == "matmul" else distance_form
    states, mask = torch.randn(32, 20, 384), torch.ones(32, 20, dtype=torch.bool)
    grids = torch.randn(512, 49, 1280)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4)
    out = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        s_q = m.normalize(m.raw_sketch(code(m.text_coder, states), mask))  # (32, N*K)
        s_i = m.normalize(m.raw_sketch(code(m.image_coder, grids))).view(32, 16, -1)  # (32, 16, N*K)
        logits = 20 * m.score(s_q[:, None], s_i)  # (32, 16), the positive in column 0
        loss = F.cross_entropy(logits, torch.zeros(32, dtype=torch.long))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.append(time.perf_counter() - t0)
    return out[1:]


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m research.temde.step")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("docs/research/results/temde_step.json"))
    args = ap.parse_args()
    rows = []
    for N, K, inner in SHAPES:
        ms = {form: round(1000 * statistics.median(step_times(N, K, inner, form, args.steps)), 1) for form in ("distance", "matmul")}
        rows.append({"N": N, "K": K, "inner": inner, "distance_ms": ms["distance"], "matmul_ms": ms["matmul"],
                     "speedup": round(ms["distance"] / ms["matmul"], 2)})
        print(rows[-1], flush=True)
    doc = {"rows": rows, "threads": torch.get_num_threads(), "machine": machine(),
           "command": "python -m research.temde.step" + (f" --steps {args.steps}" if args.steps != 6 else "")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
