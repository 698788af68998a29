"""`crossprobe calibrate`'s run: the dev sets indexed with the checkpoint (the batch jobs), their captions searched
through a server of this process (the service), the curves fitted (models/training/calibrate.py). Here, in the
command line, because it runs both the batch jobs and the service; research/calibration/fit.py writes it up."""

from __future__ import annotations

from pathlib import Path


def fit_calibration(ckpt: Path, workdir: Path, limit: int | None, refresh: bool, command: str, log=print) -> dict:
    """The dev sets indexed with the checkpoint, their captions searched through a server of this process (scores
    cached in workdir per fingerprint), the curves fitted -> models/training/calibrate.analyse()'s output with its
    "meta"."""
    import time

    import httpx

    from crossprobe.core import read_config
    from crossprobe.indexer import build
    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.models.data.captioned import CaptionedFolder, coco_root
    from crossprobe.models.data.flickr8k import available, dataset_root
    from crossprobe.models.evaluation.report import machine
    from crossprobe.models.training import calibrate as cal
    from crossprobe.service.server import running, wait_ready
    from crossprobe.service.settings import Settings

    if not available() or not CaptionedFolder.available(coco_root()):
        raise FileNotFoundError(f"Flickr8k ({dataset_root()}) or coco-mini-dev ({coco_root()}) not found")
    workdir.mkdir(parents=True, exist_ok=True)
    root = workdir / "indexes"
    sets = cal.dev_sets(workdir, limit)
    for name, s in sets.items():
        build(
            cal.index_name(name),
            manifest=s["manifest"],
            settings=IndexerSettings(index_root=root, progress=False),
            ckpt=ckpt,
            log=lambda *_: None,
        )
    fp = read_config(ckpt)["fingerprint"]
    cache = workdir / f"scores-{fp}.json"
    t = time.perf_counter()
    if cache.exists() and not refresh:
        data, absent = cal.load_scores(cache)
    else:
        settings = Settings(
            index_root=root,
            port=0,
            indexes=",".join(cal.index_name(n) for n in sets),
            ckpt=ckpt,
            access_log=False,
            log_level="warning",
        )
        with running(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
            wait_ready(client)
            data, absent = cal.collect_all(client, sets, log)
        cal.save_scores(cache, data, absent)
    out = cal.analyse(data, absent, sets)
    out["meta"] = {
        "fingerprint": fp,
        "fitted_on": cal.FITTED_ON,
        "command": command,
        "machine": machine(),
        "seconds": round(time.perf_counter() - t, 1),
        "absent_queries": cal.ABSENT,
    }
    return out
