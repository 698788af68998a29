"""Fit the relevance curves (core/calibration.py) on the two dev sets, through the API, and measure them: the
write-up of `crossprobe calibrate` (models/training/calibrate.py says how the curves are fitted and measured).

    .venv/bin/python -m research.calibration.fit [--limit N] [--ckpt DIR]
        -> docs/research/results/calibration.json (curves, ECE, reliability, absent-query cutoffs)
           docs/research/calibration.md's numbers, docs/images/reliability.svg
    crossprobe calibrate [--ckpt DIR]   the same fit, stored in the checkpoint as calibration.json

Scores are cached per checkpoint under --workdir (--refresh queries again): after one of the two, the other
fits in seconds.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from crossprobe.core import DEFAULT_CHECKPOINT
from crossprobe.models.training.calibrate import MODES
from crossprobe.cli.calibrate import fit_calibration


def svg(reliab: dict, path: Path) -> None:
    """Reliability diagrams: one panel per mode, a line per dev set (predicted vs observed per bin)."""
    W, H, P = 220, 220, 36
    colours = {"f8k-dev": "#1f77b4", "ood-dev": "#d62728"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{len(MODES) * (W + P) + P}" height="{H + 2 * P + 20}" '
             'font-family="sans-serif" font-size="11">']
    for i, mode in enumerate(MODES):
        x0, y0 = P + i * (W + P), P
        parts.append(f'<rect x="{x0}" y="{y0}" width="{W}" height="{H}" fill="none" stroke="#888"/>')
        parts.append(f'<line x1="{x0}" y1="{y0 + H}" x2="{x0 + W}" y2="{y0}" stroke="#bbb" stroke-dasharray="4"/>')
        parts.append(f'<text x="{x0 + W / 2}" y="{y0 - 8}" text-anchor="middle">{mode}</text>')
        parts.append(f'<text x="{x0 + W / 2}" y="{y0 + H + 16}" text-anchor="middle">predicted relevance (0 to 1)</text>')
        parts.append(f'<text x="{x0 - 6}" y="{y0 + H / 2}" text-anchor="middle" transform="rotate(-90 {x0 - 6} '
                     f'{y0 + H / 2})">observed: own photo</text>')
        for name, colour in colours.items():
            pts = [(b["predicted"], b["observed"]) for b in reliab[mode][name] if b["n"] >= 20]
            if pts:
                line = " ".join(f"{x0 + p * W:.1f},{y0 + H - o * H:.1f}" for p, o in pts)
                parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
                parts += [f'<circle cx="{x0 + p * W:.1f}" cy="{y0 + H - o * H:.1f}" r="2.5" fill="{colour}"/>'
                          for p, o in pts]
    for j, (name, colour) in enumerate(colours.items()):
        parts.append(f'<text x="{P + j * 120}" y="{H + 2 * P + 14}" fill="{colour}">{name} (observed)</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="first N captions of each set (default: all)")
    ap.add_argument("--ckpt", type=Path, default=DEFAULT_CHECKPOINT)
    ap.add_argument("--workdir", type=Path, default=Path("artifacts/calibration"))
    ap.add_argument("--refresh", action="store_true", help="query again even if the scores are cached")
    args = ap.parse_args()
    command = "python -m research.calibration.fit" + (f" --limit {args.limit}" if args.limit else "")
    try:
        out = fit_calibration(args.ckpt, args.workdir, args.limit, args.refresh, command)
    except FileNotFoundError as e:
        raise SystemExit(f"{e}") from None
    res = Path("docs/research/results")
    res.mkdir(parents=True, exist_ok=True)
    (res / "calibration.json").write_text(json.dumps(out, indent=1))
    summarise(out, res / "library_features.json")
    svg(out["reliability"], Path("docs/images/reliability.svg"))
    for mode in MODES:
        print(mode, "shift", out["curves"][mode]["shift"], "ECE top-10", out["ece"][mode], "top-1", out["ece_top1"][mode])
        print("  at 90% gold kept:", out["absent"][mode]["at_90pct_gold_kept"])


def summarise(out: dict, path: Path) -> None:
    """Issue 34's numbers, beside the library's other features: ECE per mode and set, and the absent queries."""
    j = json.loads(path.read_text()) if path.exists() else {}
    j["relevance"] = {"from": "docs/research/results/calibration.json", "command": out["meta"]["command"],
                      "machine": out["meta"]["machine"], "ece_top10": out["ece"], "ece_top1": out["ece_top1"],
                      "shift": {m: c["shift"] for m, c in out["curves"].items()},
                      "absent_at_90pct_gold_kept": {m: a["at_90pct_gold_kept"] for m, a in out["absent"].items()},
                      "absent_by_cutoff": {m: a["by_cutoff"] for m, a in out["absent"].items()}}
    path.write_text(json.dumps(j, indent=1))


if __name__ == "__main__":
    main()
