"""Issue 47 through the service: a model is a spec, and an index is bound to its model.

A random-weight tiny Hugging Face CLIP (tests/support/reference_models.py, trained BPE tokenizer whose bytes cover
every script), exported through the inference seam (CROSSPROBE_MODEL=hf:<folder>), indexes scikit-image's 16 sample
photos (photos in RGB, L and 1-bit, at their own sizes) and serves them:
- two-tower and hybrid search answer; a reranker the model lacks is a 422 when named and an explicit "none" when it
  is the server's default; no explain maps, no relevance (both refused clearly);
- queries in Chinese, Arabic, Hindi and Russian reach the model untouched: the API's two-tower scores equal the
  reference implementation's (transformers' CLIPModel with its processor) g_q . g_I for every returned photo;
- its versions store no reranker feature value (0 bytes: nothing written) and record the model's spec;
- a service of another model refuses the index and says which model built it and the two ways out;
- `crossprobe index reindex NAME --model SPEC` moves a library from crossprobe's checkpoint to the family model
  while a live service keeps answering from the old version, and a service of the new model then serves it.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from crossprobe.indexer import build, open_index
from crossprobe.indexer.jobs.settings import IndexerSettings
from crossprobe.storage.redis_conn import connect
from crossprobe.storage.store import Store
from tests.indexer.conftest import make_images
from tests.service.live import Traffic, start
from tests.service.live import stop as stop_process

QUERIES = {"en": "a photo of a cup of coffee", "zh": "一杯咖啡的照片", "ar": "صورة لفنجان قهوة",
           "hi": "कॉफ़ी के कप की तस्वीर", "ru": "фотография чашки кофе"}
quiet = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """(spec, reference, photos) of the random tiny Hugging Face CLIP and the sample photos it indexes."""
    from tests.support import reference_models as rm

    work = tmp_path_factory.mktemp("family")
    ref = rm.build("hf_clip", work / "hf_clip_tiny", size="tiny")
    return f"hf:{ref.path}", ref, rm.sample_photos(work / "photos")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory) -> Path:
    """One models folder for the jobs and the service (models_dir): the model is exported once."""
    return tmp_path_factory.mktemp("family-graphs")


@pytest.fixture(scope="module")
def indexed(family, graphs, redis_server, redis_url, tmp_path_factory):  # noqa: F811
    """Index "photos" of the sample photos, built with the family model (its spec in the settings, as
    CROSSPROBE_MODEL gives it) into a flushed Redis -> (IndexerSettings, version)."""
    spec, _, photos = family
    redis_server.flushall()
    ixs = IndexerSettings(redis_url=redis_url, index_root=tmp_path_factory.mktemp("family-index"), model=spec,
                          models_dir=graphs, batch_size=8, threads=2, progress=False)
    return ixs, build("photos", images=photos[0].parent, settings=ixs, **quiet).version


def _settings(ixs: IndexerSettings, graphs: Path, **over):
    from crossprobe.service.settings import Settings

    base = dict(redis_url=ixs.redis_url, index_root=ixs.index_root, model=ixs.model, models_dir=graphs,
                threads=2, workers=2, reload_interval_s=0, access_log=False, admin_key="s3cret-admin-key-0123", batch_wait_ms=1.0)
    return Settings(**{**base, **over})


@pytest.fixture(scope="module")
def client(indexed, graphs):
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready

    with TestClient(create_app(_settings(indexed[0], graphs))) as c:
        wait_ready(c)
        yield c


def test_a_family_model_serves_two_tower_and_hybrid_search(client, family, indexed):
    spec, _, photos = family
    info = client.get("/v1/indexes").json()
    model = info["model"]
    assert model["spec"] == spec and model["rerankers"] == [] and model["default_rerank"] == "none"
    assert model["explain"] is False and model["relevance"] is False
    assert info["indexes"][0]["model"] == spec and info["indexes"][0]["fingerprint"] == model["fingerprint"]
    ready = client.get("/readyz").json()
    assert ready["model_spec"] == spec and ready["rerankers"] == [] and ready["unavailable"] == {}
    # no reranker named: the server's default (temde) is not trained for this model -> none, said
    body = client.post("/v1/search", json={"query": "a cup of coffee", "k": 5}).json()
    assert body["rerank"] == "none" and "default reranker temde is not trained for this model" in body["rerank_skipped"]
    assert body["mode"] == "hybrid" and len(body["results"]) == 5 and not body["degraded"]
    assert all(h["relevance"] is None and h["scores"]["rerank"] is None for h in body["results"])
    # hybrid: the file name's word finds its photo (the keyword side), fused with the vector order
    body = client.post("/v1/search", json={"query": "coffee", "k": 3}).json()
    assert body["results"][0]["id"].startswith("coffee") and body["keyword"]["hits"] >= 1, body
    # an image query and "more like this" run the image tower / the stored vectors of this model
    like = client.post("/v1/search", json={"like": [body["results"][0]["id"]], "k": 3}).json()
    assert like["rerank"] == "none" and len(like["results"]) == 3
    with open(photos[0], "rb") as f:
        r = client.post("/v1/search/image?k=1", content=f.read())
    assert r.status_code == 200 and r.json()["results"][0]["id"] == photos[0].name, r.text


def test_what_the_model_lacks_is_refused_clearly(client, family):
    spec = family[0]
    for rerank in ("cp", "temde"):
        r = client.post("/v1/search", json={"query": "a cup of coffee", "rerank": rerank})
        err = r.json()["error"]
        assert r.status_code == 422 and err["code"] == "reranker_unavailable", r.text
        assert err["details"] == {"rerank": rerank, "rerankers": []} and spec in err["message"]
        assert 'send rerank "none"' in err["message"]
    r = client.post("/v1/search/image?query=a+cup&rerank=cp", content=family[2][0].read_bytes())
    assert r.status_code == 422 and r.json()["error"]["code"] == "reranker_unavailable", r.text
    r = client.post("/v1/search", json={"query": "a cup of coffee", "min_relevance": 0.1})
    assert r.status_code == 422 and "has no relevance calibration" in r.json()["error"]["message"], r.text
    ids = [h["id"] for h in client.post("/v1/search", json={"query": "coffee", "k": 1}).json()["results"]]
    r = client.post("/v1/explain", json={"query": "coffee", "ids": ids})
    assert r.status_code == 422 and r.json()["error"]["code"] == "explain_unavailable", r.text
    assert spec in r.json()["error"]["message"]
    # the OpenAPI document says so where a client reads it
    doc = client.get("/openapi.json").json()
    assert "reranker_unavailable" in doc["paths"]["/v1/search"]["post"]["responses"]["422"]["description"]
    assert "explain_unavailable" in doc["paths"]["/v1/explain"]["post"]["responses"]["422"]["description"]


def test_queries_in_any_script_reach_the_model_untouched(client, family):
    """The API's two-tower scores against the reference's own embeddings of the same photos and texts."""
    _, ref, photos = family
    api_scores_are_the_references(client, ref, photos, index="photos")


def api_scores_are_the_references(client, ref, photos: list[Path], index: str) -> None:
    """Every photo's two-tower score for each query of QUERIES (POST /v1/search, mode vector, rerank none, all
    photos returned) within 1e-4 of the reference's g_q . g_I, and ranked in its order up to near ties (2e-4)."""
    from tests.support import reference_models as rm

    emb = rm.reference_embeddings(ref, photos, list(QUERIES.values()))
    scores = emb.text @ emb.image.T
    names = [p.name for p in photos]
    for qi, (lang, text) in enumerate(QUERIES.items()):
        body = client.post("/v1/search", json={"query": text, "k": len(names), "rerank": "none", "mode": "vector",
                                               "index": index}).json()
        got = {h["id"]: h["score"] for h in body["results"]}
        assert sorted(got) == sorted(names), (lang, body)
        want = dict(zip(names, scores[qi].tolist()))
        assert max(abs(got[n] - want[n]) for n in names) <= 1e-4, (lang, got, want)
        order = [h["id"] for h in body["results"]]
        for a, b in zip(order, order[1:]):  # never ranked above a photo the reference scores higher (beyond ties)
            assert want[a] >= want[b] - 2e-4, (lang, a, b)
    # different scripts are different queries to the model, not one mangled string
    assert len({tuple(np.round(s, 5)) for s in scores}) == len(QUERIES)


@pytest.mark.openclip
def test_multilingual_queries_through_the_api_with_mclip(redis_url, tmp_path):  # noqa: F811
    """M-CLIP (an XLM-R text tower with the open_clip image tower it was trained against; tiny, random) indexed and
    served: the API's scores for the English, Chinese, Arabic, Hindi and Russian queries equal multilingual_clip's
    own forward and open_clip's encode_image. Needs open_clip: the export venv (make test-openclip)."""
    import open_clip  # noqa: F401 (fail, not skip, outside the export venv)
    from fastapi.testclient import TestClient

    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready
    from tests.support import reference_models as rm

    ref = rm.build("mclip", tmp_path / "mclip", size="tiny")
    photos = rm.sample_photos(tmp_path / "photos")
    ixs = IndexerSettings(redis_url=redis_url, index_root=tmp_path / "indexes", model=f"hf:{ref.path}",
                          models_dir=tmp_path / "graphs", batch_size=8, threads=2, progress=False)
    build("multilingual", images=photos[0].parent, settings=ixs, **quiet)
    with TestClient(create_app(_settings(ixs, tmp_path / "graphs", indexes="multilingual"))) as c:
        wait_ready(c)
        assert c.get("/v1/indexes").json()["model"]["spec"] == f"hf:{ref.path}"
        api_scores_are_the_references(c, ref, photos, index="multilingual")


def test_a_two_tower_version_stores_no_reranker_values_and_records_its_model(indexed, family):
    ixs, version = indexed
    store = Store(ixs, connect(ixs))
    m = store.read_manifest("photos", version)
    assert m["model_spec"] == family[0] and m["layout"]["itemsize"] == 0 and m["layout"]["fields"] == []
    keys = [k.decode() for k in store.r.scan_iter(match=f"{store.prefix}:photos:{version}:*", count=1000)]
    kinds = {k.split(f":{version}:", 1)[1][:2] for k in keys}
    assert kinds == {"m:"} and len(keys) == m["count"] == 16  # metadata per photo, no feature value at all
    rd = open_index("photos", m["fingerprint"], ixs)
    feats = rd.features(rd.ids[:3])  # nothing to fetch: empty arrays of the reader's shapes
    assert {k: v.shape for k, v in feats.items()} == {"p_v": (3, 0, 0), "b_bar": (3, 0), "s_i": (3, 0)}


def test_a_service_of_another_model_refuses_the_index_and_says_what_to_do(indexed, family, svc_ckpt, artifacts):
    from fastapi.testclient import TestClient

    from crossprobe.models import checkpoint
    from crossprobe.service.app import create_app

    ixs, version = indexed
    spec, fp = family[0], Store(ixs, connect(ixs)).read_manifest("photos", version)["fingerprint"]
    ours = checkpoint.read_config(svc_ckpt)["fingerprint"]
    settings = _settings(ixs, artifacts, model=None, ckpt=svc_ckpt)
    with TestClient(create_app(settings)) as c:
        deadline = time.monotonic() + 120
        while "no index served yet" not in (why := c.get("/readyz").json()["error"]["message"]):
            assert time.monotonic() < deadline, why
            time.sleep(0.1)
        r = c.get("/readyz")
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        for text in (r.json()["error"]["message"], c.get("/v1/indexes").json()["unavailable"]["photos"]):
            assert f"index 'photos' version {version} was built with model {spec} (fingerprint {fp})" in text
            assert f"this service runs model crossprobe:{svc_ckpt} (fingerprint {ours})" in text
            assert f"serve the index's model (CROSSPROBE_MODEL={spec})" in text
            assert f"crossprobe index reindex photos --model crossprobe:{svc_ckpt}" in text


def test_serve_takes_a_model_spec_and_refuses_a_bad_one_at_once(monkeypatch, tmp_path):
    """`crossprobe serve --model SPEC`: a spec that names no model, or --model and --ckpt naming two, is a usage error
    (exit 2, the reason said) before anything loads; --model replaces the environment's CROSSPROBE_CKPT."""
    from typer.testing import CliRunner

    from crossprobe import cli

    monkeypatch.setattr("crossprobe.service.server.serve", lambda settings: print("SERVING", settings.model_spec))
    r = CliRunner().invoke(cli.app, ["serve", "--model", "clip:ViT-B-32"])
    assert r.exit_code == 2 and "unknown family 'clip'" in r.output, r.output
    r = CliRunner().invoke(cli.app, ["serve", "--model", "hf:/m", "--ckpt", str(tmp_path)])
    assert r.exit_code == 2 and "name different models" in r.output, r.output
    r = CliRunner().invoke(cli.app, ["serve", "--model", "hf:/m"], env={"CROSSPROBE_CKPT": str(tmp_path)})
    assert r.exit_code == 0 and "SERVING hf:/m" in r.output, r.output


# ---- a library moved to another model under live traffic ----------------------------------------------------

def test_reindex_moves_a_library_to_another_model_under_live_traffic(family, graphs, svc_ckpt, artifacts, bert,
                                                                      redis_server, redis_url, tmp_path):  # noqa: F811
    """The model upgrade of docs/operations.md with a family model: a library ("lib", beside the module's "photos") built
    with crossprobe's checkpoint and
    served live; `crossprobe index reindex lib --model hf:...` re-encodes it while two clients search without pause
    (every answer a 200 from the old version: the new one is refused by the running service, which says so); a
    service started with CROSSPROBE_MODEL=hf:... then serves the new version, two-tower."""
    import httpx

    from crossprobe.cli import app
    from typer.testing import CliRunner

    spec = family[0]
    gallery = tmp_path / "gallery"
    make_images(gallery, 12)
    ixs = IndexerSettings(redis_url=redis_url, index_root=tmp_path / "indexes", models_dir=graphs, batch_size=4,
                          threads=1, progress=False)
    v1 = build("lib", images=gallery, settings=ixs, ckpt=svc_ckpt, bert=bert, **quiet).version
    env = {"REDIS_URL": redis_url, "CROSSPROBE_INDEX_ROOT": str(ixs.index_root)}
    env["CROSSPROBE_RELOAD_INTERVAL_S"] = "0.1"
    old, old_url = start({**env, "CROSSPROBE_CKPT": str(svc_ckpt), "CROSSPROBE_MODELS_DIR": str(artifacts)},
                         tmp_path / "old.log")
    traffic = Traffic(old_url, [{"query": "query 0", "k": 3, "rerank": "temde"}, {"query": "query 1", "k": 3}])
    try:
        with traffic:
            cli_env = {**env, "CROSSPROBE_MODELS_DIR": str(graphs), "CROSSPROBE_INDEX_THROTTLE_S": "0.3",
                       "CROSSPROBE_INDEX_BATCH_SIZE": "2", "CROSSPROBE_INDEX_PROGRESS": "false"}
            before = traffic.total()
            out = CliRunner().invoke(app, ["index", "reindex", "lib", "--model", spec], env=cli_env)
            assert out.exit_code == 0, out.output
            during = traffic.total() - before
            store = Store(ixs, connect(ixs))
            v2 = store.active("lib")
            assert v2 != v1 and store.read_manifest("lib", v2)["model_spec"] == spec
            time.sleep(1.0)  # a few polls of the old service: it sees the switch and refuses the new version
            unavailable = httpx.get(f"{old_url}/v1/indexes", timeout=10).json()["unavailable"]["lib"]
            assert f"built with model {spec}" in unavailable and "CROSSPROBE_MODEL=" + spec in unavailable
    finally:
        stop_process(old)
    assert not traffic.failed(), traffic.failed()[:3]
    assert during > 0 and all(set(traffic.versions(i)) == {v1} for i in range(2))  # the old version throughout
    assert "Traceback" not in (tmp_path / "old.log").read_text()

    new, new_url = start({**env, "CROSSPROBE_MODEL": spec, "CROSSPROBE_MODELS_DIR": str(graphs)},
                         tmp_path / "new.log", timeout_s=180)
    try:
        body = httpx.post(f"{new_url}/v1/search", json={"query": "a photo", "k": 3}, timeout=30).json()
        assert body["index"]["version"] == v2 and body["rerank"] == "none" and body["rerank_skipped"]
        assert json.loads(httpx.get(f"{new_url}/readyz", timeout=10).text)["model_spec"] == spec
    finally:
        stop_process(new)
    assert "Traceback" not in (tmp_path / "new.log").read_text()


def test_an_immich_folder_indexes_and_serves(redis_server, redis_url, tmp_path):  # noqa: F811
    """CROSSPROBE_MODEL=immich:<folder>, a folder in Immich's layout written from the random tiny CLIP
    (tests/core/inference/immich_layout.py): the indexer builds the sample photos with it and the API's two-tower
    scores equal the folder's own graphs' g_q . g_I for every photo, and the reference's (transformers' CLIPModel)
    for every photo whose pixels Immich's preprocessing gives as Hugging Face's processor does."""
    from fastapi.testclient import TestClient
    from transformers import AutoTokenizer

    from crossprobe.core import inference
    from crossprobe.models import families
    from crossprobe.core.inference import RuntimeOptions
    from crossprobe.service.app import create_app
    from crossprobe.service.server import wait_ready
    from tests.core.inference import immich_layout
    from tests.support import reference_models as rm

    ref = rm.build("hf_clip", tmp_path / "ref", size="tiny")
    folder = immich_layout.write(tmp_path / "ViT-tiny__random", families.load(f"hf:{ref.path}"),
                                 AutoTokenizer.from_pretrained(ref.path), 77)
    spec, graphs = f"immich:{folder}", tmp_path / "graphs"
    photos = rm.sample_photos(tmp_path / "photos")
    names, texts = [p.name for p in photos], list(QUERIES.values())
    redis_server.flushall()
    ixs = IndexerSettings(redis_url=redis_url, index_root=tmp_path / "indexes", model=spec, models_dir=graphs,
                          batch_size=8, threads=2, progress=False)
    build("immich", images=photos[0].parent, settings=ixs, **quiet)

    b = inference.load(spec, RuntimeOptions(graphs=graphs, threads=1))
    pixels = np.stack([b.preprocess(im) for im in rm.open_images(photos)])
    own = (np.stack([v.g_q for v in b.encode_texts(texts)]) @ b.encode_images(pixels).g.T)
    want = rm.reference_embeddings(ref, photos, texts)
    same = [i for i in range(len(photos)) if np.array_equal(pixels[i], want.pixel_values[i])]
    assert len(same) >= 8, same
    with TestClient(create_app(_settings(ixs, graphs, indexes="immich"))) as c:
        wait_ready(c)
        model = c.get("/v1/indexes").json()["model"]
        assert model["spec"] == spec and model["rerankers"] == []
        for qi, text in enumerate(texts):
            body = c.post("/v1/search", json={"query": text, "k": len(names), "rerank": "none", "mode": "vector",
                                              "index": "immich"}).json()
            got = {h["id"]: h["score"] for h in body["results"]}
            assert sorted(got) == sorted(names), body
            api = np.array([got[n] for n in names])
            assert np.abs(api - own[qi]).max() <= 1e-4, (text, api, own[qi])
            assert np.abs(api[same] - (want.text[qi] @ want.image.T)[same]).max() <= 1e-4, text
