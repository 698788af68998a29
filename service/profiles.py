"""How the service runs a model's query tower where the settings leave it open, chosen per model from measurements
at 1 and 4 clients (docs/research/serving_profiles.md, benchmarks/serving_profiles.py), not one setting for every
model:

    threads       ONNX Runtime intra-op threads per graph run (CROSSPROBE_THREADS)
    shared_pool   one process-wide pool for every graph, whose workers spin (CROSSPROBE_ORT_SHARED_POOL)
    spinning      idle workers of a graph's own pool spin (CROSSPROBE_ORT_SPINNING)
    encoders      query-tower batches run at once (batcher.QueryBatcher; CROSSPROBE_QUERY_ENCODERS)

crossprobe's own query tower is two MiniLM layers, a few milliseconds: one thread, and the shared pool, which beat
a pool per graph when the query tower and a scorer run one after the other (docs/research/ort_threading.md). A
CLIP-sized text tower (every family model, and reranker heads on one) is most of a search: two threads per run
nearly halve it, but only on pools that do not spin (spinning workers take the cores that the other searches and
the second thread need); one batch at a time keeps two threads from running two batches on two cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from crossprobe.core.inference.spec import ModelSpec


@dataclass(frozen=True)
class Profile:
    threads: int
    shared_pool: bool
    spinning: bool
    encoders: int


def for_model(spec: ModelSpec, cores: int | None = None) -> Profile:
    """The measured profile of the model a spec names (by its family: the size of its query tower)."""
    if spec.family == "crossprobe" and not _heads(spec):
        return Profile(threads=1, shared_pool=True, spinning=True, encoders=1)
    return Profile(threads=min(2, cores or os.cpu_count() or 1), shared_pool=False, spinning=False, encoders=1)


def _heads(spec: ModelSpec) -> bool:
    """Reranker heads on a family backbone (a crossprobe: checkpoint of kind "heads"): the backbone's text tower."""
    from crossprobe.core.inference.heads import backbone_spec

    return spec.path is not None and backbone_spec(spec.path) is not None
