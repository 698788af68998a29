"""`crossprobe calibrate` end to end on generated data: the dev sets indexed, their captions searched through a server,
the curves stored in the checkpoint; run again (queried again), the same calibration.json."""
import json
import shutil

from typer.testing import CliRunner

from crossprobe.core import calibration, read_config
from crossprobe.models.training import calibrate as cal
from tests.indexer.conftest import make_images


def _tiny_sets(gallery):
    """Two sets over 8 generated photos, 3 made-up captions each (the real ones need Flickr8k and coco-mini-dev)."""
    photos = sorted(p for p in gallery.rglob("*.*"))[:8]

    def dev_sets(workdir, limit):
        items = [(f"g/{p.name}", p) for p in photos]
        pairs = [(f"{w} picture number {i}", f"g/{p.name}") for i, p in enumerate(photos) for w in ("a", "the", "one")]
        out = {}
        for name, keep in (("f8k-dev", items), ("ood-dev", items[:6])):
            manifest = workdir / f"{name}.jsonl"
            manifest.write_text("".join(json.dumps({"id": i, "uri": str(u)}) + "\n" for i, u in keep))
            ids = {i for i, _ in keep}
            out[name] = {"manifest": manifest, "pairs": [pq for pq in pairs if pq[1] in ids][:limit], "images": len(keep)}
        return out
    return dev_sets


def test_calibrate_stores_curves_and_reproduces_them(svc_ckpt, artifacts, models_dir, redis_server, redis_url,
                                                     tmp_path, monkeypatch):
    from crossprobe.models.data import captioned, flickr8k
    from crossprobe.cli import app

    make_images(tmp_path / "gallery", 8)
    monkeypatch.setattr(cal, "dev_sets", _tiny_sets(tmp_path / "gallery"))
    monkeypatch.setattr(flickr8k, "available", lambda root=None: True)
    monkeypatch.setattr(captioned.CaptionedFolder, "available", staticmethod(lambda root: True))
    for k, v in {"REDIS_URL": redis_url, "CROSSPROBE_MODELS_DIR": str(artifacts),
                 "CROSSPROBE_THREADS": "2"}.items():
        monkeypatch.setenv(k, v)
    ck = tmp_path / "ck"
    shutil.copytree(svc_ckpt, ck)  # the session's checkpoint stays without curves
    runner = CliRunner()
    stored = []
    for extra in ([], ["--refresh"]):
        r = runner.invoke(app, ["calibrate", "--ckpt", str(ck), "--workdir", str(tmp_path / "w"),
                                "--results", str(tmp_path / "results.json"), *extra])
        assert r.exit_code == 0, r.output + repr(r.exception)
        d = json.loads((ck / calibration.FILE).read_text())
        stored.append(d)
        assert set(d["curves"]) == set(cal.MODES)
        assert d["meta"]["fingerprint"] == read_config(ck)["fingerprint"]
        assert d["meta"]["sets"] == {"f8k-dev": {"captions": 24, "photos": 8}, "ood-dev": {"captions": 18, "photos": 6}}
        assert d["meta"]["command"].startswith("crossprobe ")  # how it was made (sys.argv: CliRunner leaves pytest's)
    for d in stored:  # where and how long it ran are the only differences
        for k in ("machine", "seconds", "command"):
            d["meta"].pop(k)
    assert stored[0] == stored[1]
    assert json.loads((tmp_path / "results.json").read_text())["curves"] == stored[1]["curves"]
    loaded = calibration.Calibration.load(ck)
    assert set(loaded.curves) == set(cal.MODES)
