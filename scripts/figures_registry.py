"""Every figure README.md and docs/*.md show, by key: the results file it comes from and how it is shown.

scripts/figures.py reads this (its docstring says how spans work). A key's file is under docs/research/results/
unless it holds a "/". Keys are grouped by the file they read. "{served}" in a path is the served checkpoint's
fingerprint (models/checkpoints/default/config.json).
"""
from __future__ import annotations

from figures import SERVED_CONFIG, Block, Fig, calc, host, num

SERVED = str(SERVED_CONFIG)


def _pct_drop(on: float, off: float) -> str:
    return f"{100 * (1 - on / off):.0f}"


def _all_answered(searches: int, ok: int) -> str:
    return f"all {searches:,}" if searches == ok else f"{ok:,} of {searches:,}"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f}"


def _kb(nbytes: float) -> str:
    return f"{nbytes / 1000:.1f}"


def _mb(nbytes: float) -> str:
    return f"{nbytes / 1e6:.0f}"


def _pct_drop_range(*rates: float) -> str:
    """"10 to 18" from (on, off) pairs of images/s: the range of the share OCR costs."""
    drops = [100 * (1 - on / off) for on, off in zip(rates[::2], rates[1::2])]
    lo, hi = round(min(drops)), round(max(drops))
    return f"{lo}" if lo == hi else f"{lo} to {hi}"


def _minus(a: float, b: float) -> str:
    return f"{a - b:.1f}"


# sizing.json (benchmarks/sizing.py): a block per Redis ("embedded", "server"), a record per size measured
SIZING_SIZES = {"embedded": ("100000", "300000"), "server": ("100000",)}
_SIZING = {  # figure -> its paths inside a size's record (several: the largest of them)
    "service_rss": ("service/rss_bytes",),
    "service_peak": ("service/peak_rss_bytes_at_end",),
    "redis_steady": ("steady/redis_used_memory",),
    "redis_add_peak": ("add/peak/redis_used_memory",),
    "redis_watch_peak": ("watch/one_batch/peak/redis_used_memory", "watch/stream/peak/redis_used_memory"),
    "redis_rss_peak": ("add/peak/redis_process_rss", "watch/stream/peak/redis_process_rss"),
    "redis_cow": ("add/peak/redis_fork_cow_bytes", "watch/one_batch/peak/redis_fork_cow_bytes",
                  "watch/stream/peak/redis_fork_cow_bytes"),
    "redis_total": ("add/peak/redis_rss_plus_cow", "watch/one_batch/peak/redis_rss_plus_cow",
                    "watch/stream/peak/redis_rss_plus_cow"),
    "version_files": ("steady/version_files/total",),
    "rdb": ("steady/redis_files/after_save",),
    "disk_peak": ("add/peak/disk_bytes", "watch/stream/peak/disk_bytes"),
    "add_rss": ("add/job/peak_rss_bytes",),
    "watcher_rss": ("watch/watcher/peak_rss_bytes",),
    "add_gc_freed": ("add/gc/redis_used_memory_freed",),
    "add_gc_rss_freed": ("add/gc/redis_process_rss_freed",),
    "watch_gc_rss_freed": ("watch/gc/redis_process_rss_freed",),
    "aof_logged": ("steady/redis_files/aof_as_logged",),
    "aof_rewritten": ("steady/redis_files/aof_after_rewrite",),
}
_SERVER_ONLY = ("aof_logged", "aof_rewritten")
# the figures benchmarks/sizing.py's slopes() gives per item and projects to 1M, by its names
_SIZING_SLOPE = {"service_rss": "service_rss", "service_peak": "service_peak_rss", "redis_steady": "redis_used_memory",
                 "redis_add_peak": "redis_peak_add", "redis_watch_peak": "redis_peak_watch",
                 "redis_rss_peak": "redis_rss_peak", "redis_cow": "redis_fork_cow_peak",
                 "redis_total": "redis_rss_plus_cow_peak", "version_files": "index_files", "rdb": "redis_files",
                 "disk_peak": "disk_peak", "add_rss": "add_job_peak_rss", "watcher_rss": "watcher_peak_rss"}


def _plan(n: int, label: str) -> dict:
    """docs/sizing.md's plan for n items: the embedded block's 1M projection plus its per-item slope for the rest
    (plan.<label>.<figure>_gb), the same straight line the 1M column follows, taken further."""
    return {f"plan.{label}.{name}_gb": calc("sizing.json", (f"embedded/projected_1000000/{slope}",
                                                            f"embedded/per_item_bytes/{slope}"),
                                            lambda at_1m, per_item: f"{(at_1m + per_item * (n - 1_000_000)) / 1e9:.1f}")
            for name, slope in _SIZING_SLOPE.items()}


def _mb_max(*nbytes: float) -> str:
    return f"{max(nbytes) / 1e6:,.0f}"


def _gb2(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f}"


def _batch_seconds(lines: list[str]) -> str:
    """The watcher's batches' seconds ("... live, N items (...) in 12.3s"): "lo to hi"."""
    secs = [float(line.rsplit(" in ", 1)[1].rstrip("s")) for line in lines]
    return f"{min(secs):.0f} to {max(secs):.0f}"


def _sizing(block: str, prefix: str) -> dict:
    """The figures of one sizing.json block: prefix.<N>k.<figure>_mb per size; with two sizes or more, per item
    (prefix.item.<figure>_kb) and projected to 1M (prefix.1m.<figure>_gb, labelled a projection on the page)."""
    sizes = SIZING_SIZES[block]
    out = {f"host.{prefix}": host("sizing.json", f"{block}/machine"),
           f"{prefix}.redis": num("sizing.json", f"{block}/redis", "{}")}
    for n in sizes:
        k, at = f"{prefix}.{int(n) // 1000}k", f"{block}/sizes/{n}"
        out.update({f"{k}.{name}_mb": calc("sizing.json", tuple(f"{at}/{p}" for p in paths), _mb_max)
                    for name, paths in _SIZING.items() if block == "server" or name not in _SERVER_ONLY})
        versions = tuple(f"{at}/watch/{phase}/peak/versions_on_disk" for phase in ("one_batch", "stream"))
        out[f"{k}.watch_versions"] = calc("sizing.json", versions, lambda *v: f"{max(v)}")
        out[f"{k}.idle_versions"] = num("sizing.json", f"{at}/watch/one_batch/idle_past_grace/versions_on_disk", "{}")
        out[f"{k}.watch_batch_s"] = calc("sizing.json", (f"{at}/watch/batches",), _batch_seconds)
        if block == "server":  # its Redis files after a save: the RDB and the append-only file (as logged then)
            out[f"{k}.rdb_only_mb"] = calc("sizing.json", (f"{at}/steady/redis_files/after_save",
                                                           f"{at}/steady/redis_files/aof_as_logged"), lambda a, b: _mb_max(a - b))
        out[f"{k}.redis_rss_peak_gb"] = calc("sizing.json", tuple(f"{at}/{p}" for p in _SIZING["redis_rss_peak"]),
                                             lambda *v: _gb2(max(v)))
    if len(sizes) > 1:
        out[f"{prefix}.between"] = calc("sizing.json", (f"{block}/between",), lambda b: f"{b[0]:,} and {b[1]:,}")
        for name, slope in _SIZING_SLOPE.items():
            out[f"{prefix}.item.{name}_kb"] = calc("sizing.json", (f"{block}/per_item_bytes/{slope}",), _kb)
            out[f"{prefix}.1m.{name}_gb"] = calc("sizing.json", (f"{block}/projected_1000000/{slope}",), _gb2)
    return out


# every p99 latency_region.json holds for the served checkpoint: (mode, clients, items) and its path
_P99S = [((m, c, n), f"{{served}}/{n}/{m}/" + ("concurrent_8/" if c == 8 else "") + "p99_ms")
         for n in ("8091", "100000") for m in ("none", "temde", "cp") for c in (1, 8)]


def _slowest_p99(*p99s: float) -> str:
    (mode, clients, items), worst = max(zip((k for k, _ in _P99S), p99s), key=lambda kv: kv[1])
    return f"{worst:.1f} ms ({mode}, {clients} client{'s' if clients > 1 else ''}, {int(items):,} items)"


def _readme_results(v) -> str:
    """The README's results table: one row per claim, each short enough for one README line."""
    rows = [
        ("Flickr8k test: text->image R@1 / R@10, 5,000 captions over 1,000 photos",
         f"two-tower {v('f8k.tt.r1')} / {v('f8k.tt.r10')}, CP {v('f8k.cp.r1')} / {v('f8k.cp.r10')}, "
         f"T-EMDE {v('f8k.temde.r1')} / {v('f8k.temde.r10')} (served)", "-",
         "[models.md](docs/models.md#the-model-card)"),
        ("out of domain: 400 COCO captions, their 80 photos among 1,000 Flickr8k photos, R@1",
         f"two-tower {v('ood.tt.r1')}, CP {v('ood.cp.r1')}, T-EMDE {v('ood.temde.r1')}", "-",
         "[ood.md](docs/research/ood.md)"),
        ("`/v1/search` with the defaults (T-EMDE, words and meaning), one client, p50 / p99",
         f"8,091 photos: {v('hybrid.8091.p50')} / {v('hybrid.8091.p99')} ms; "
         f"100,000 items: {v('hybrid.100k.p50')} / {v('hybrid.100k.p99')} ms",
         v("host.text_search.latency"), "[text_search.md](docs/research/text_search.md)"),
        ("`/v1/search` by reranker, meaning only, 100,000 items, p50 / p99",
         f"none {v('lat.100k.none.p50')} / {v('lat.100k.none.p99')} ms, T-EMDE {v('lat.100k.temde.p50')} / "
         f"{v('lat.100k.temde.p99')} ms, CP {v('lat.100k.cp.p50')} / {v('lat.100k.cp.p99')} ms; 8 clients, T-EMDE: "
         f"{v('lat.100k.temde.c8.qps')} searches/s", v("host.latency_region"),
         "[region_labels.md](docs/research/region_labels.md#6-re-run-with-the-new-default)"),
        ("indexing the first 2,000 Flickr8k photos; storage per item",
         f"{v('ix.rate.1')} images/s ({v('ix.rate.2')} with 2 decode threads); Redis {v('ix.redis_kb')} KB, FAISS "
         f"{v('ix.faiss_kb')} KB; OCR on: {v('ocr.cost_pct')}% fewer images/s", v("host.indexer_region"),
         "[indexing.md](docs/indexing.md#engines-and-speed)"),
        ("1M items, FAISS HNSW32 (CP measured with af8bbd6b, the served towers before region labels)",
         f"ANN recall@100 {v('1m.recall')}; CP p50 / p99 {v('1m.p50')} / {v('1m.p99')} ms; service RSS "
         f"{v('1m.rss_gb')} GB", v("host.scale.1m"), "[scaling.md](docs/research/scaling.md)"),
        ("query by image: a cropped, shrunk, recompressed copy finds its original among 8,091",
         f"top-1 {v('img.top1')}%, top-5 {v('img.top5')}%, p50 {v('img.p50')} ms", v("host.search_features"),
         "[search_features.md](docs/research/search_features.md)"),
        ("words in photos (OCR): a quoted word printed in the photo, R@1",
         f"{v('ocr.quoted.hybrid')} ({v('ocr.quoted.read')} where OCR read it; meaning alone {v('ocr.quoted.vector')}); "
         f"Flickr8k captions {v('ocr.f8k.vector')} -> {v('ocr.f8k.hybrid')}", "-",
         "[text_search.md](docs/research/text_search.md)"),
        (f"Redis paused {v('redis.pause_s')} s under {v('redis.rate')} searches/s",
         f"{v('redis.paused.answered')} searches answered (two-tower order, degraded), the longest "
         f"{v('redis.longest_ms')} ms; reranking back {v('redis.recovery_s')} s after Redis resumed",
         v("host.redis_faults_load"), "[reliability.md](docs/research/reliability.md)"),
    ]
    lines = ["| what | result | host | page |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows])


# model_choice.json (benchmarks/model_costs.py, benchmarks/model_parity.py, benchmarks/model_end_to_end.py; the
# published rows copied from their sources): docs/models.md, "Choose a model"
MC = "model_choice.json"
COST_ROWS = ("default", "vit_b32", "vit_b16", "siglip_base", "mclip")


def _speedup(fp: float, q8: float) -> str:
    return f"{fp / q8:.1f}"


def _choose_table(v) -> str:
    """docs/models.md's table: one row per family, measured costs beside the published quality."""
    label = {"default": "crossprobe (the committed checkpoint; `crossprobe:`)", "vit_b32": "CLIP ViT-B/32 (`open_clip:ViT-B-32/...`)",
             "vit_b16": "CLIP ViT-B/16 (`open_clip:ViT-B-16/...`)", "siglip_base": "SigLIP base (`hf:google/siglip-base-patch16-224`)",
             "mclip": "M-CLIP XLM-R large + ViT-B/32, multilingual (`hf:M-CLIP/XLM-Roberta-Large-Vit-B-32`)"}
    pub = {"default": "Flickr8k test R@1 " + v("f8k.temde.r1") + " (ours, T-EMDE)",
           "vit_b32": f"Flickr30k {v('pub.vit_b32.f30k')}, COCO {v('pub.vit_b32.coco')} (laion2b); OpenAI's weights "
                      f"{v('pub.vit_b32_openai.f30k')} / {v('pub.vit_b32_openai.coco')}",
           "vit_b16": f"Flickr30k {v('pub.vit_b16.f30k')}, COCO {v('pub.vit_b16.coco')} (laion2b)",
           "siglip_base": f"Flickr30k {v('pub.siglip_base.f30k')}, COCO {v('pub.siglip_base.coco')} (webli)",
           "mclip": f"R@10 on translated COCO: en {v('pub.mclip.en')}, zh {v('pub.mclip.zh')}, ru {v('pub.mclip.ru')}"}
    head = ("| model | graphs MB | indexed images/s | query p50 / p99 ms | service RSS MB | int8: image, query x faster "
            "(cosine to fp32) | published text->image retrieval (below) |\n|---|---|---|---|---|---|---|")
    rows = []
    for m in COST_ROWS:
        q8 = (f"{v(f'cost.{m}.int8.img')}, {v(f'cost.{m}.int8.query')} (>= {v(f'cost.{m}.int8.cos')})"
              if m != "default" else "query tower only: `CROSSPROBE_QUERY_PRECISION=int8`")
        rows.append(f"| {label[m]} | {v(f'cost.{m}.graphs')} | {v(f'cost.{m}.ips')} | {v(f'cost.{m}.p50')} / "
                    f"{v(f'cost.{m}.p99')} | {v(f'cost.{m}.rss')} | {q8} | {pub[m]} |")
    return "\n".join([head, *rows])


FIGURES: dict[str, Fig | Block] = {
    "readme.results": Block(_readme_results),
    "ckpt.fingerprint": Fig(SERVED, ("fingerprint",)),

    # the GPU check's dry run on the CPU and what travels to a GPU machine (docs/deployment.md, "GPU")
    "host.gpu_dry": calc("gpu_dry_run.json", ("environment/cpu",),  # "2 cores, AMD EPYC"
                         lambda c: f"{c.split(' cores, ')[0]}-core {c.split(', ', 1)[1]}"),
    "gpu_dry.total_s": num("gpu_dry_run.json", "total_s", "{:.0f}"),
    **{f"gpu_dry.{k}_s": num("gpu_dry_run.json", f"steps/{k}/seconds", "{:.1f}") for k in (
        "environment", "photos", "parity", "index", "grow", "ann", "service_cpu", "service_device_fp32",
        "service_device_fp16", "encode", "vit")},
    "gpu_dry.fp32.grid": num("gpu_dry_run.json", "parity/fp32/outputs/backbone.grid/max_abs", "{:.1e}"),
    "host.device_travel": host("device_travel.json"),
    **{f"travel.{k}": num("device_travel.json", k, "{:.2f}") for k in ("wheels_mib", "minilm_files_mib", "tree_mib",
                                                                         "travels_mib", "left_mib")},
    "travel.tree_files": num("device_travel.json", "tree_files", "{}"),

    # choosing a model (model_choice.json)
    "models.choose": Block(_choose_table),
    "host.model_costs": host(MC, "costs/machine"),
    **{f"cost.{m}.{k}": num(MC, f"costs/rows/{m}/{path}", fmt) for m in COST_ROWS for k, path, fmt in (
        ("graphs", "graphs_mb", "{:,.0f}"), ("ips", "images_per_s", "{:.1f}"), ("p50", "query_p50_ms", "{:.1f}"),
        ("p99", "query_p99_ms", "{:.1f}"), ("rss", "service_rss_mb", "{:,.0f}"))},
    **{f"cost.{m}.int8.img": calc(MC, (f"costs/rows/{m}/int8/fp32/image_ms_per_photo",
                                        f"costs/rows/{m}/int8/int8/image_ms_per_photo"), _speedup) for m in COST_ROWS[1:]},
    **{f"cost.{m}.int8.query": calc(MC, (f"costs/rows/{m}/int8/fp32/query_encode_p50_ms",
                                          f"costs/rows/{m}/int8/int8/query_encode_p50_ms"), _speedup)
       for m in COST_ROWS[1:]},
    **{f"cost.{m}.int8.cos": calc(MC, (f"costs/rows/{m}/int8/cosine_to_fp32/image_min",
                                        f"costs/rows/{m}/int8/cosine_to_fp32/query_min"), lambda a, b: f"{min(a, b):.4f}")
       for m in COST_ROWS[1:]},
    **{f"pub.{m}.{k}": num(MC, f"published/rows/{m}/{path}", "{:.1f}") for m in ("vit_b32", "vit_b32_openai", "vit_b16",
       "siglip_base", "xlmr_base") for k, path in (("f30k", "flickr30k_t2i_r1"), ("coco", "mscoco_t2i_r1"))},
    **{f"pub.mclip.{lang}": num(MC, f"published/rows/mclip/humanly_translated_mscoco_t2i_r10/{lang}", "{:.1f}")
       for lang in ("en", "zh", "ru")},
    **{f"parity.{c}": num(MC, f"parity/{c}/max_abs_diff", "{:.1e}") for c in ("open_clip", "hf_clip", "hf_siglip", "mclip")},
    "e2e.agree": calc(MC, ("end_to_end/agree", "end_to_end/queries"), lambda a, q: f"{a} of {q}"),
    "e2e.max_score_diff": num(MC, "end_to_end/max_score_diff", "{:.1e}"),
    # the index path on coco-mini-dev (benchmarks/index_path.py), at the default decoding and decoded reduced
    **{f"ip.{f}.agree": calc(MC, (f"index_path/families/{f}/agree", f"index_path/families/{f}/queries"),
                             lambda a, q: f"{a} of {q}") for f in ("hf_clip", "immich", "open_clip")},
    **{f"ip.{f}.max_score_diff": num(MC, f"index_path/families/{f}/max_score_diff", "{:.1e}")
       for f in ("hf_clip", "immich", "open_clip")},
    "ip.reduced.agree": calc(MC, ("index_path/reduced_for_comparison/hf_clip/agree",
                                  "index_path/reduced_for_comparison/hf_clip/queries"), lambda a, q: f"{a} of {q}"),
    "ip.reduced.max_score_diff": num(MC, "index_path/reduced_for_comparison/hf_clip/max_score_diff", "{:.1e}"),
    "ip.reduced_photos": calc(MC, ("index_path/families/hf_clip/photos_reduced_by_draft",
                                   "index_path/families/hf_clip/photos"), lambda a, n: f"{a} of {n}"),
    # decoding both ways (benchmarks/decode_cost.py)
    **{f"dec.{r}.{k}": num("decode.json", f"rows/jpeg_{r}/{k}", fmt)
       for r in ("640px", "12mp") for k, fmt in (("full_ms_median", "{:.1f}"), ("reduced_ms_median", "{:.1f}"),
                                                  ("embedding_max_abs_diff", "{:.1e}"))},
    "host.decode": host("decode.json"),
    # crossprobe beside clip-retrieval (benchmarks/peer_clip_retrieval.py)
    **{f"peer.{s}.{k}": num("peer_clip_retrieval.json", f"summary/{s}/{k}", fmt) for s in ("clip_back", "crossprobe")
       for k, fmt in (("p50_ms_1_client", "{:.1f}"), ("p99_ms_1_client", "{:.1f}"), ("qps_4_clients", "{:.1f}"))},
    **{f"peer.index.{s}": num("peer_clip_retrieval.json", f"indexing/{s}/images_per_s", "{:.1f}")
       for s in ("clip_retrieval", "crossprobe")},
    "peer.ratio_p50": num("peer_clip_retrieval.json", "ratio_p50_1_client", "{:.2f}"),
    "peer.ratio_qps": num("peer_clip_retrieval.json", "ratio_qps_4_clients", "{:.1f}"),
    # benchmarks/model_end_to_end.py's _host(): "<cpu>, <n> cores"
    "host.peer": calc("peer_clip_retrieval.json", ("host",),
                      lambda h: f"{h.rsplit(', ', 1)[1].split()[0]}-core {h.rsplit(', ', 1)[0]}"),
    # a user's first run, counted (scripts/first_run.py, make first-run)
    "first_run.python": calc("first_run.json", ("python",), str),
    "first_run.commands": calc("first_run.json", ("commands_count",), str),
    "first_run.max_score_diff": num("first_run.json", "max_score_diff_to_the_repos_graphs", "{:.1e}"),
    # the query-vector cache (benchmarks/query_cache_bench.py)
    **{f"qc.{p}.encode.p50": num("query_cache.json", f"passes/{p}/encode/p50_ms", "{:.3f}") for p in ("hit", "miss")},
    "host.query_cache": host("query_cache.json"),

    # Flickr8k test, the served checkpoint (crossprobe eval --no-ood ...)
    **{f"f8k.{m}.r{k}": num("region_served_test.json", f"t2i/{src}/R@{k}")
       for m, src in (("tt", "TT"), ("cp", "CP@100"), ("temde", "TEMDE@100")) for k in (1, 5, 10)},
    **{f"f8k.{m}.i2t.r1": num("region_served_test.json", f"i2t/{src}/R@1", "{:.1f}")
       for m, src in (("tt", "TT"), ("cp", "CP@100"), ("temde", "TEMDE@100"))},

    # out of domain (crossprobe eval --no-flickr): "default" is the served checkpoint, "baseline" the one before
    **{f"ood.{m}.r1": num("ood.json", f"coco-mini-dev+f8k-dev/default/{src}/R@1")
       for m, src in (("tt", "TT"), ("cp", "CP@100"), ("temde", "TEMDE@100"))},
    **{f"ood.before.{m}.r1": num("ood.json", f"coco-mini-dev+f8k-dev/baseline/{src}/R@1")
       for m, src in (("cp", "CP@100"), ("temde", "TEMDE@100"))},

    # the demo gallery's 16 queries: through the service (make test-deploy, on the host) and offline (crossprobe eval)
    "demo.service_first": calc("deploy.json", ("search_expected_first/host", "search_expected_first/of"),
                               lambda n, of: f"{n} of {of}"),
    "demo.offline_first": calc("ood.json", ("gallery/top1", "gallery/queries"), lambda n, of: f"{n} of {of}"),

    # grayscale copies of the dev photos (python -m research.misses.grayscale)
    "gray.loss_pct": calc("grayscale.json", ("dev_sets/f8k-dev/TEMDE@100/grayscale/R@1",
                                             "dev_sets/f8k-dev/TEMDE@100/colour/R@1"), _pct_drop),

    # training the committed checkpoint (benchmarks/training_time.py)
    "train.minutes": num("training_time.json", "total_min", "{:.0f}"),
    "host.training_time": host("training_time.json"),

    # /v1/search with the served defaults (T-EMDE, mode hybrid), one client (benchmarks.hybrid_bench)
    "hybrid.8091.p50": num("text_search.json", "latency/indexes/8091/hybrid/p50_ms", "{:.1f}"),
    "hybrid.8091.p99": num("text_search.json", "latency/indexes/8091/hybrid/p99_ms", "{:.1f}"),
    "hybrid.100k.p50": num("text_search.json", "latency/indexes/100000/hybrid/p50_ms", "{:.1f}"),
    "hybrid.100k.p99": num("text_search.json", "latency/indexes/100000/hybrid/p99_ms", "{:.1f}"),
    "hybrid.100k.vector.p99": num("text_search.json", "latency/indexes/100000/vector/p99_ms", "{:.1f}"),
    "host.text_search.latency": host("text_search.json", "latency/machine"),

    # /v1/search by reranker, mode vector, the served checkpoint (benchmarks.service_bench, in latency_region.json)
    **{f"lat.{n}.{m}.{q}": num("latency_region.json", f"{{served}}/{size}/{m}/{q}_ms", "{:.1f}")
       for n, size in (("8091", "8091"), ("100k", "100000")) for m in ("none", "temde", "cp") for q in ("p50", "p99")},
    **{f"lat.{n}.{m}.c8.{q}": num("latency_region.json", f"{{served}}/{size}/{m}/concurrent_8/{q}_ms", "{:.1f}")
       for n, size in (("8091", "8091"), ("100k", "100000")) for m in ("none", "temde", "cp") for q in ("p50", "p99")},
    **{f"lat.{n}.{m}.c8.qps": num("latency_region.json", f"{{served}}/{size}/{m}/concurrent_8/qps", "{:.0f}")
       for n, size in (("8091", "8091"), ("100k", "100000")) for m in ("none", "temde", "cp")},
    "host.latency_region": host("latency_region.json", "{served}/machine"),
    "lat.before.8091.cp.c8.p99": num("latency_region.json", "af8bbd6b7043b70b/8091/cp/concurrent_8/p99_ms", "{:.1f}"),
    "lat.max_p99": calc("latency_region.json", tuple(path for _, path in _P99S), _slowest_p99),

    # the indexer with the served checkpoint (benchmarks.indexer_bench --limit 2000)
    "ix.images": num("indexer_region.json", "images", "{:,}"),
    "ix.rate.1": num("indexer_region.json", "images_per_s/1", "{:.1f}"),
    "ix.rate.2": num("indexer_region.json", "images_per_s/2", "{:.1f}"),
    "ix.redis_kb": calc("indexer_region.json", ("redis_bytes_per_item",), _kb),
    "ix.faiss_kb": calc("indexer_region.json", ("faiss_bytes_per_item",), _kb),
    "host.indexer_region": host("indexer_region.json"),

    # words and OCR (docs/research/text_search.md)
    "ocr.cost_pct": calc("text_search.json", ("indexing/images_per_s/workers 1, ocr on",
                                              "indexing/images_per_s/workers 1, ocr off"), _pct_drop),
    "ocr.rate.on": num("text_search.json", "indexing/images_per_s/workers 1, ocr on", "{:.0f}"),
    "ocr.rate.off": num("text_search.json", "indexing/images_per_s/workers 1, ocr off", "{:.0f}"),
    "host.text_search.indexing": host("text_search.json", "indexing/machine"),
    "ocr.quoted.hybrid": num("text_search.json", "hybrid_test/sets/text-test/quoted/R@1 hybrid", "{:.1f}"),
    "ocr.quoted.read": num("text_search.json", "hybrid_test/sets/text-test/quoted/R@1 hybrid, word indexed", "{:.1f}"),
    "ocr.quoted.vector": num("text_search.json", "hybrid_test/sets/text-test/quoted/R@1 vector", "{:.1f}"),
    "ocr.f8k.vector": num("text_search.json", "hybrid_test/sets/f8k-test/caption/R@1 vector"),
    "ocr.f8k.hybrid": num("text_search.json", "hybrid_test/sets/f8k-test/caption/R@1 hybrid"),

    "ocr.cost_range": calc("text_search.json", tuple(f"{run}/images_per_s/workers {w}, ocr {s}"
                                                     for run in ("indexing", "indexing_repeat") for w in (1, 2)
                                                     for s in ("on", "off")), _pct_drop_range),
    "gate.signs": num("text_search.json", "feature_gate/test/probe/recall_synthetic_ocr_reads", "{:.1f}"),
    "gate.documents": num("text_search.json", "feature_gate/documents/test/recall", "{:.0f}"),
    "gate.plain": num("text_search.json", "feature_gate/test/probe/pass_flickr8k", "{:.1f}"),
    "gate.t7.threshold": num("text_search.json", "feature_gate/at_7_percent/threshold", "{:.2f}"),
    "gate.t7.signs": num("text_search.json", "feature_gate/at_7_percent/test/probe/recall_synthetic_ocr_reads", "{:.1f}"),
    "gate.t7.plain": num("text_search.json", "feature_gate/at_7_percent/test/probe/pass_flickr8k", "{:.1f}"),
    "kw.mb": calc("text_search.json", ("keyword_engines/tantivy/bytes",), lambda b: f"{b / 1e6:.1f}"),
    "kw.build_s": num("text_search.json", "keyword_engines/tantivy/build_s", "{:.1f}"),
    "host.text_search.keyword": host("text_search.json", "keyword_engines/machine"),

    # a watched folder under load (benchmarks.watch_bench)
    "watch.lag.p50": num("library_features.json", "watch/steady/lag_s/p50", "{:.1f}"),
    "watch.lag.p99": num("library_features.json", "watch/steady/lag_s/p99", "{:.1f}"),
    "host.watch": host("library_features.json", "watch/machine"),

    # `crossprobe index backup` / `index restore` of a Flickr8k index (benchmarks.backup_restore)
    "br.items": num("backup_restore.json", "items", "{:,}"),
    "br.archive_mb": calc("backup_restore.json", ("archive_bytes",), _mb),
    "br.backup_s": num("backup_restore.json", "median/backup_s", "{:.1f}"),
    "br.verify_s": num("backup_restore.json", "median/verify_s", "{:.2f}"),
    "br.restore_s": num("backup_restore.json", "median/restore_s", "{:.1f}"),
    "br.repeat": calc("backup_restore.json", ("runs",), lambda runs: f"{len(runs)}"),
    "br.load": calc("backup_restore.json", ("runs",),
                    lambda runs: f"{max(v for r in runs for k, v in r.items() if k.startswith('load_')):.1f}"),
    "host.backup_restore": host("backup_restore.json"),

    # the Ray Data engine against the default one (benchmarks.ray_indexer_bench)
    "ray.single": num("ray_indexer.json", "summary/single/images_per_s_median", "{:.0f}"),
    "ray.ray": num("ray_indexer.json", "summary/ray/images_per_s_median", "{:.0f}"),
    "ray.startup_s": calc("ray_indexer.json", ("summary/ray/one_batch_wall_s_median",
                                               "summary/single/one_batch_wall_s_median"), _minus),
    "host.ray_indexer": host("ray_indexer.json"),

    # the container image and the compose stack (make image && make test-deploy)
    "deploy.date": calc("deploy.json", ("date",), lambda d: d[:10]),
    "deploy.podman": calc("deploy.json", ("machine/podman",), lambda s: s.replace(" version", "")),
    "deploy.ready.cold": num("deploy.json", "api_ready_s/cold", "{:.1f}"),
    "deploy.ready.warm": num("deploy.json", "api_ready_s/warm", "{:.1f}"),
    "deploy.indexed": calc("deploy.json", ("indexer_job/items", "indexer_job/photos"), lambda n, of: f"{n} of {of}"),
    "deploy.index_failed": num("deploy.json", "indexer_job/failed", "{}"),
    "deploy.same_first": calc("deploy.json", ("search_expected_first/same_first_as_host", "search_expected_first/of"),
                              lambda n, of: f"{n} of {of}"),
    "deploy.expected_first": calc("deploy.json", ("search_expected_first/n", "search_expected_first/of"),
                                  lambda n, of: f"{n} of {of}"),
    "deploy.watch.added_s": num("deploy.json", "watcher/added_served_after_s", "{:.1f}"),
    "deploy.watch.deleted_s": num("deploy.json", "watcher/deleted_gone_after_s", "{:.1f}"),
    "deploy.rules": calc("deploy.json", ("prometheus_rules/ok", "prometheus_rules/rules"), lambda n, of: f"{n} of {of}"),
    "deploy.queries": calc("deploy.json", ("prometheus_queries/with_data", "prometheus_queries/total"),
                           lambda n, of: f"{n} of {of}"),
    "deploy.queries.empty": calc("deploy.json", ("prometheus_queries/empty",), lambda e: "; ".join(e) or "none"),
    "deploy.stop_s": num("deploy.json", "sigterm_clean/stop_s"),
    "deploy.grace_s": num("deploy.json", "sigterm_clean/grace_s", "{}"),
    "deploy.exit": num("deploy.json", "sigterm_clean/exit_code", "{}"),
    "deploy.degraded_readyz": num("deploy.json", "degraded_on_redis_stop/readyz", "{}"),
    "deploy.recovered_s": num("deploy.json", "recovered/after_s"),
    **{f"deploy.layer.{name}_mb": calc("deploy.json", (f"image_layers/{i}/bytes",), _mb)
       for i, name in enumerate(("venv", "graphs", "base", "python"))},
    **{f"deploy.fill.{name}_mb": calc("deploy.json", (f"image_fills/{i}/kib",), lambda kib: _mb(kib * 1024))
       for i, name in ((1, "onnxruntime"), (2, "crossprobe"), (10, "tantivy"))},
    "deploy.build_cold_s": calc("deploy.json", ("build_s/cold",), lambda s: f"{s:.0f}"),
    "deploy.build_unchanged_s": calc("deploy.json", ("build_s/unchanged",), lambda s: f"{s:.0f}"),
    "deploy.build_cached_s": calc("deploy.json", ("build_s/cached",), lambda s: f"{s:.0f}"),
    "deploy.failed_start_s": num("deploy.json", "failed_start/failed_after_s", "{:.1f}"),
    "deploy.load": calc("deploy.json", ("machine/load_average_at_end",), lambda la: f"{la[0]:.0f}"),
    "deploy.rss_peak_mb": calc("deploy.json", ("api_rss_bytes/load_peak",), _mb),
    "deploy.rss_load": num("deploy.json", "api_rss_bytes/load", "{}"),
    **{f"deploy.lat.{side}.{q}": num("deploy.json", f"search_latency_ms/{side}/{q}", "{:.1f}")
       for side in ("container", "host") for q in ("p50", "p99")},
    "deploy.lat.n": num("deploy.json", "search_latency_ms/container/n", "{}"),
    "deploy.lat.p50_ratio": num("deploy.json", "container_vs_host_p50_ratio"),
    "deploy.lat.p99_ratio": num("deploy.json", "container_vs_host_p99_ratio"),
    "deploy.image_mb": calc("deploy.json", ("image_bytes",), _mb),
    "deploy.rss_idle_mb": calc("deploy.json", ("api_rss_bytes/idle",), _mb),
    "host.deploy": host("deploy.json"),

    # two api replicas behind the compose proxy, one killed under load (make test-deploy, tests/deploy/test_replicas.py)
    "replicas.n": num("replicas.json", "replicas", "{}"),
    "replicas.requests": calc("replicas.json", ("requests",), lambda n: f"{n:,}"),
    "replicas.failed": num("replicas.json", "failed", "{}"),
    "replicas.rejoin_s": num("replicas.json", "rejoin_s", "{:.1f}"),
    "replicas.ready_s": num("replicas.json", "kill_run/timeline_s/ready", "{:.1f}"),
    "replicas.clients": num("replicas.json", "kill_run/load/clients", "{}"),
    "replicas.load_s": num("replicas.json", "kill_run/load/seconds", "{:.0f}"),
    "replicas.kill_at_s": num("replicas.json", "kill_run/load/kill_at_s", "{}"),
    "replicas.retries": num("replicas.json", "kill_run/proxy_retries", "{}"),
    "replicas.redispatches": num("replicas.json", "kill_run/proxy_redispatches", "{}"),
    "replicas.p50_ms": num("replicas.json", "kill_run/latency_ms/p50", "{:.1f}"),
    "replicas.p99_ms": num("replicas.json", "kill_run/latency_ms/p99", "{:.1f}"),
    "replicas.max_near_kill_ms": num("replicas.json", "kill_run/latency_ms/max_sent_within_5s_of_the_kill", "{:.0f}"),
    "replicas.identical": calc("replicas.json", ("identical_answers/identical", "identical_answers/queries"),
                               lambda n, of: f"{n} of {of}"),
    "replicas.new_version_s": calc("replicas.json", ("new_version/served_after_s",),
                                   lambda d: " and ".join(f"{v:.1f}" for _, v in sorted(d.items()))),
    "replicas.date": calc("replicas.json", ("date",), lambda d: d[:10]),
    "replicas.podman": calc("replicas.json", ("machine/podman",), lambda s: s.replace(" version", "")),
    "host.replicas": host("replicas.json"),

    # 1M items (benchmarks.scale_bench), FAISS HNSW32 in the service's process
    "1m.recall": num("scale.json", "1000000/faiss_hnsw/recall@100", "{:.3f}"),
    "1m.p50": num("scale.json", "1000000/faiss_hnsw/p50_ms", "{:.1f}"),
    "1m.p99": num("scale.json", "1000000/faiss_hnsw/p99_ms", "{:.1f}"),
    "1m.rss_gb": num("scale.json", "1000000/faiss_hnsw/rss_gb", "{:.2f}"),
    "1m.faiss_kb": calc("scale.json", ("1000000/faiss_hnsw/faiss_bytes_per_item",), _kb),
    "host.scale.1m": host("scale.json", "1000000/faiss_hnsw/machine"),
    "1m.ann_p50": num("scale.json", "1000000/faiss_hnsw/ann_ms/p50", "{:.1f}"),
    "1m.milvus.p50": num("scale.json", "1000000/milvus_server/p50_ms", "{:.1f}"),
    "1m.milvus.p99": num("scale.json", "1000000/milvus_server/p99_ms", "{:.1f}"),
    "1m.milvus.recall": num("scale.json", "1000000/milvus_server/recall@100", "{:.3f}"),
    "1m.milvus.ef": num("scale.json", "1000000/milvus_server/index/ef", "{}"),
    "1m.milvus.rss_gb": calc("scale.json", ("1000000/milvus_server/rss_bytes",), _gb),
    "1m.milvus.ann_p50": num("scale.json", "1000000/milvus_server/ann_ms/p50", "{:.1f}"),
    **{f"1m.milvus.filter.{name}": num("scale.json", f"1000000/milvus_server/filtered/{share}/p99_ms", "{:.1f}")
       for name, share in (("1pct", "0.01"), ("10pct", "0.1"), ("100pct", "1.0"))},
    "1m.lite.p50": num("scale.json", "1000000/milvus/p50_ms", "{:.0f}"),
    "host.scale.1m.lite": host("scale.json", "1000000/milvus/machine"),

    # Redis Cluster against one Redis (benchmarks/redis_cluster_fetch.py)
    "cluster.fetch.p50": num("redis_cluster.json", "cluster/p50_ms"),
    "cluster.single.p50": num("redis_cluster.json", "single/p50_ms"),
    "cluster.stop_s": num("redis_cluster.json", "failover/sigstop/degraded_s", "{:.1f}"),
    "cluster.kill_s": num("redis_cluster.json", "failover/sigkill/degraded_s", "{:.1f}"),
    "host.redis_cluster": host("redis_cluster.json"),

    # query by image (benchmarks.image_query_quality)
    "img.top1": num("search_features.json", "image_query/top1", "{:.1f}"),
    "img.top5": num("search_features.json", "image_query/top5", "{:.0f}"),
    "img.p50": num("search_features.json", "image_query/latency_ms/p50", "{:.1f}"),
    "host.search_features": host("search_features.json"),

    # Redis paused and killed under load (benchmarks.redis_faults)
    "redis.rate": num("redis_faults_load.json", "settings/rate", "{:.0f}"),
    "redis.pause_s": num("redis_faults_load.json", "settings/pause_s", "{:.0f}"),
    "redis.paused.answered": calc("redis_faults_load.json", ("phases/paused/searches", "phases/paused/search_status/200"),
                                  _all_answered),
    "redis.longest_ms": num("redis_faults_load.json", "phases/paused/longest_in_flight_ms", "{:.0f}"),
    "redis.killed.longest_ms": num("redis_faults_load.json", "phases/killed/longest_in_flight_ms", "{:.0f}"),
    "redis.recovery_s": num("redis_faults_load.json", "recovery_s/after_sigcont"),
    "redis.restart_recovery_s": num("redis_faults_load.json", "recovery_s/after_restart"),
    "host.redis_faults_load": host("redis_faults_load.json"),

    # sizing: memory and disk by library size (benchmarks/sizing.py): the embedded Redis, and a compose-like server
    **_sizing("embedded", "sizing"),
    **_plan(2_000_000, "2m"),
    **_sizing("server", "sizing.server"),
    "sizing.base_photos": num("sizing.json", "embedded/base_photos", "{:,}"),
    "sizing.service_base_mb": calc("sizing.json", ("embedded/service_base/rss_bytes",), _mb_max),
    "sizing.feature_bytes": num("sizing.json", "embedded/sizes/100000/steady/redis_values/feature_value_bytes", "{:,.0f}"),
    "sizing.metadata_bytes": num("sizing.json", "embedded/sizes/100000/steady/redis_values/metadata_value_bytes",
                                 "{:,.0f}"),
}

# Results files that record a checkpoint other than the served one, and why their figures hold for it
OTHER_CHECKPOINT: dict[str, str] = {
    "training_time.json": "af8bbd6b7043b70b is the training run whose weights are served: region labels were added "
                          "to it afterwards without training (models.md)",
    "search_features.json": "4a5badc96f3d85d6 has the served towers (every checkpoint since changed rerankers only), "
                            "and image queries are answered by the towers alone (rerank none)",
}

# Pages the unbound-figure check leaves out, and why
UNCHECKED_PAGES: dict[str, str] = {
    "docs/configuration.md": "generated from the Settings classes' descriptions (scripts/settings_table.py)",
}

# Phrases on a page that read as measurements but are settings, limits or examples (page -> phrases on the line)
ALLOWED: dict[str, tuple[str, ...]] = {
    "docs/api.md": ("`CROSSPROBE_QUERY_IMAGE_MAX_BYTES` (768 KiB)", "usually larger than 768 KiB",
                    "`CROSSPROBE_MAX_BODY_BYTES` (1 MiB"),
    "docs/security.md": ("`CROSSPROBE_MAX_BODY_BYTES` (1 MiB)", "`CROSSPROBE_QUERY_IMAGE_MAX_BYTES` (768 KiB decoded)"),
    "docs/indexing.md": ("(100 million) pixels", "`CROSSPROBE_INDEX_REINDEX_MAX_LOST`, 1%"),
    "docs/troubleshooting.md": ("`--max-lost` (default 1%)",),
    "docs/operations.md": ("more than 1% of user-facing requests", "`crossprobe:search_p99_budget_seconds` (150 ms)",
                           "a 200 ms timeout", "`PING` every 0.5 s", "`--max-lost` (1%)"),
}
