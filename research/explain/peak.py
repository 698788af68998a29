"""How peaked are the explain maps today? The baseline for issue 32, item 5 (maps that point).

    python -m research.explain.peak
        -> docs/research/results/explain_peak.json

The demo's 16 queries over its 16 sample photos (`make demo`'s gallery, the committed checkpoint, an embedded
Redis), through a server on loopback: for each query, POST /v1/explain for its first result and for the photo it
should find. Peakedness of a 7 x 7 map: its largest cell's weight as a multiple of an even share (1/49): 1 is flat,
49 all on one cell. Issue 32 asks for at least 3 on average, with the region term's per-cell scores as the map.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import httpx
import numpy as np

from crossprobe.indexer import build
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.models.demo import EXPECTED
from crossprobe.models.evaluation.report import machine
from crossprobe.models.demo import write_sample_gallery
from crossprobe.service.server import running, wait_ready
from crossprobe.service.settings import Settings


def peak(m: list[list[float]]) -> float:
    a = np.asarray(m, float)
    return float(a.max() * a.size / a.sum())


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="explain-peak-"))
    ixs = IndexerSettings(redis_url=None, index_root=work / "indexes", progress=False)
    build("samples", images=write_sample_gallery(work / "gallery"), settings=ixs, log=lambda *_: None)
    settings = Settings(redis_url=None, index_root=ixs.index_root, port=0, access_log=False, log_level="warning")
    rows = {}
    with running(settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        wait_ready(client)
        for q, photo in EXPECTED.items():
            top = client.post("/v1/search", json={"query": q, "mode": "vector", "k": 1}).json()["results"][0]["id"]
            ids = list(dict.fromkeys([top, f"{photo}.jpg"]))
            r = client.post("/v1/explain", json={"query": q, "ids": ids}).json()
            rows[q] = {"first": top, "expected": f"{photo}.jpg", "mode": r["mode"],
                       "query_map_peak": {i: round(peak(r["maps"][i]), 2) for i in ids if i in r["maps"]},
                       "probe_map_peak": {i: round(peak(r["probe_maps"][i]), 2) for i in ids if i in r["probe_maps"]}}
    firsts = [rows[q]["query_map_peak"][rows[q]["first"]] for q in rows]
    expected = [rows[q]["query_map_peak"][rows[q]["expected"]] for q in rows]
    out = {"queries": rows, "mean_peak_first_result": round(float(np.mean(firsts)), 2),
           "mean_peak_expected_photo": round(float(np.mean(expected)), 2),
           "mean_probe_map_peak": round(float(np.mean([v for q in rows for v in rows[q]["probe_map_peak"].values()])), 2),
           "command": "python -m research.explain.peak", "machine": machine()}
    Path("docs/research/results/explain_peak.json").write_text(json.dumps(out, indent=1))
    print({k: v for k, v in out.items() if k != "queries"})


if __name__ == "__main__":
    main()
