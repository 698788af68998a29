"""What a job leaves besides the version itself: report.json (counts and every skip with its reason), and the
reindex's loss check, which keeps a version that lost too many items from going live."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from crossprobe.core.atomic import durable_write as atomic_write  # fsynced: an index survives a power cut
from crossprobe.core.runtime import StageTimer
from crossprobe.indexer.jobs.sources import Skip
from crossprobe.storage import layout


class TooManyLost(RuntimeError):
    """A reindex lost more items than IndexerSettings.reindex_max_lost allows; its version is complete, not active."""


def check_lost(name: str, version: str, base: str, counts: dict, max_lost: float, report: Path) -> None:
    """A reindex may lose the items whose sources went away, but not more than max_lost of the old version:
    past that, something is wrong with the sources (a disk not mounted, moved files), not with a few items."""
    lost, old = counts["lost"], counts["base_count"]
    if old and lost / old > max_lost:
        raise TooManyLost(
            f"reindex of {name!r} lost {lost} of the {old} items of version {base} ({lost / old:.1%} > the allowed "
            f"{max_lost:.1%}; reasons in {report}), so {version} was NOT activated and "
            f"{base} stays active. Restore the sources and run the reindex again, or accept the loss: "
            f"crossprobe index activate {name} {version} (or rerun with --max-lost "
            f"{math.ceil(lost / old * 100) / 100})."
        )


def write_report(
    vdir: Path,
    kind: str,
    total: int,
    skips: list[Skip],
    times: StageTimer,
    t0: float,
    encoded: int,
    reused: int,
    factory: str,
    extra: dict,
) -> dict:
    counts: dict[str, int] = {}
    for sk in skips:
        counts[sk.reason] = counts.get(sk.reason, 0) + 1
    elapsed = time.perf_counter() - t0
    report = {
        "kind": kind,
        "factory": factory,
        "counts": {"total": total, "encoded_this_run": encoded, "reused_batches": reused, "skipped": counts, **extra},
        "skipped": [sk.__dict__ for sk in skips],
        "stages_s": times.seconds(),
        "elapsed_s": round(elapsed, 3),
        "images_per_s": round(encoded / elapsed, 2) if elapsed else None,
    }
    atomic_write(vdir / layout.REPORT, json.dumps(report, indent=1, ensure_ascii=False))
    return report
