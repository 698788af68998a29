"""Index-time OCR (indexer/jobs/ocr.py) with the real rapidocr engine, and the keyword index a job writes beside
each version (build; add deriving it from its base's, delete writing it whole)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from crossprobe.indexer import add, build, delete
from crossprobe.indexer.jobs import ocr
from crossprobe.storage import keyword
from crossprobe.storage.store import Store
from crossprobe.storage.redis_conn import connect
from tests.indexer.jobs.test_erase import stored_docs

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"


def sign(path: Path, words: str, size=(640, 480), font_px: int = 56) -> Path:
    """A photo-like picture with a sign: dark letters on a light board over a noisy background."""
    rng = np.random.default_rng(len(words))
    img = Image.fromarray((rng.random((size[1], size[0], 3)) * 80 + 60).astype(np.uint8))
    d = ImageDraw.Draw(img)
    w, h = size
    d.rectangle((w // 10, h // 3, w - w // 10, h // 3 + font_px * 2), fill=(240, 240, 235))
    d.text((w // 10 + 20, h // 3 + font_px // 2), words, font=ImageFont.truetype(FONT, font_px), fill=(20, 20, 20))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, quality=92)
    return path


ALL = np.ones(49, np.float32)  # cell probabilities of a photo the gate passes everywhere: read whole


@pytest.fixture(scope="module")
def reader():
    return ocr.Reader()


@pytest.fixture(scope="module")
def cells(models_dir):
    """path -> (49,) the trained text gate's cell probabilities, on the real backbone's grid."""
    from crossprobe.core import inputs
    from crossprobe.models.data.features import image_backbone_session

    sess = image_backbone_session(models_dir)
    gate = ocr.Reader().gate
    return lambda path: gate.cells(sess.run(None, {"pixels": inputs.load_image(path)[None]})[0])[0]


def test_reads_the_words_on_a_sign(reader, cells, tmp_path):
    p = str(sign(tmp_path / "s.jpg", "BAKERY"))
    out = reader.read(p, cells(p))
    assert "BAKERY" in out["text"].upper()


def test_the_gate_reads_only_where_it_sees_writing(reader, cells, tmp_path):
    # the sign fills the photo's middle band: the gate passes it and points there, not at the whole photo
    p = str(sign(tmp_path / "s.jpg", "PHARMACY"))
    c = cells(p)
    assert c.max() >= reader.gate.cfg.threshold
    x0, y0, x1, y1 = reader.gate.crop(c, 640, 480)
    assert y0 > 0 and y1 < 480 and y0 <= 480 // 3 and y1 >= 480 // 3 + 112


def test_a_photo_without_text_gets_no_text(reader, cells, tmp_path):
    arr = np.zeros((300, 400, 3), np.uint8) + np.linspace(0, 255, 400, dtype=np.uint8)[None, :, None]
    Image.fromarray(arr).save(tmp_path / "plain.png")
    c = cells(str(tmp_path / "plain.png"))
    assert c.max() < reader.gate.cfg.threshold  # the gate stops it: OCR never runs
    assert reader.read(str(tmp_path / "plain.png"), c) == {}
    assert ocr.Reader(threshold=0).read(str(tmp_path / "plain.png"), c) == {}  # read whole, still nothing


def test_a_huge_image_is_read_at_a_bounded_size(reader, tmp_path):
    # 20,000 x 20,000: OCR sees it at MAX_SIDE (JPEG draft decoding), and the detector at most DET_MAX_SIDE
    p = tmp_path / "huge.jpg"
    Image.new("RGB", (20_000, 20_000), (200, 200, 200)).save(p, quality=50)
    img = ocr._photo(str(p))
    assert max(img.size) <= ocr.MAX_SIDE
    assert max(ocr._scaled(img, (0, 0, *img.size)).shape[:2]) <= ocr.DET_MAX_SIDE
    assert "text_error" not in reader.read(str(p), ALL)


def test_a_small_photo_is_enlarged_as_full_ocr_would(tmp_path):
    img = Image.new("RGB", (224, 224), "white")
    s = ocr.DET_SHORT_SIDE / 224
    assert ocr._scaled(img, (0, 0, 224, 224)).shape[:2] == (ocr.DET_SHORT_SIDE,) * 2
    assert ocr._scaled(img, (32, 64, 96, 160)).shape[:2] == (round(96 * s), round(64 * s))  # a crop at that scale
    big = Image.new("RGB", (1280, 960), "white")
    assert ocr._scaled(big, (0, 0, 640, 480)).shape[:2] == (480, 640)  # large enough already: as it is


def test_a_page_of_words_keeps_a_bounded_text(tmp_path):
    img = Image.new("RGB", (1200, 1600), "white")
    d = ImageDraw.Draw(img)
    f = ImageFont.truetype(FONT, 22)
    for row in range(60):  # a dense page: many lines of words
        d.text((20, 10 + row * 26), " ".join(f"word{row}x{c}" for c in range(12)), font=f, fill="black")
    img.save(tmp_path / "page.png")
    out = ocr.Reader(threshold=0).read(str(tmp_path / "page.png"), ALL)
    assert 0 < len(out["text"]) <= ocr.MAX_CHARS


def test_a_file_ocr_cannot_read_is_said_not_raised(reader, tmp_path):
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    assert "text_error" in reader.read(str(tmp_path / "bad.jpg"), ALL)


def _meta(settings, name):
    store = Store(settings, connect(settings))
    v = store.active(name)
    ids = store.read_ids(name, v)
    return v, {i: json.loads(m) for i, m in zip(ids, store.metadata(name, v, ids))}, store.version_dir(name, v)


def _kw(vdir: Path, text: str) -> list[str]:
    return [i for i, _ in keyword.KeywordIndex(vdir / keyword.DIR).search(keyword.parse(text), 10)]


def test_build_with_ocr_stores_the_words_and_indexes_them(settings, ckpt, tmp_path):
    folder = tmp_path / "photos"
    sign(folder / "shop.jpg", "PHARMACY")
    Image.new("RGB", (120, 90), (10, 120, 30)).save(folder / "field.png")
    settings = settings.model_copy(update={"ocr": True})
    build("p", images=folder, settings=settings, ckpt=ckpt, log=lambda *_: None)
    v, metas, vdir = _meta(settings, "p")
    assert "PHARMACY" in metas["shop.jpg"]["text"].upper() and "text" not in metas["field.png"]
    assert _kw(vdir, "pharmacy") == ["shop.jpg"]
    manifest = json.loads((vdir / "manifest.json").read_text())
    assert manifest["text"]["items"] == 2 and manifest["text"]["fields"] == list(keyword.FIELDS)


def test_add_derives_the_keyword_index_from_its_base_and_delete_writes_it_whole(settings, ckpt, tmp_path, gallery):
    """add copies the base's keyword index and inserts its items; delete writes it from every item, so that the
    deleted item's id and words leave the files (tantivy only marks a deleted document)."""
    build("k", images=gallery, settings=settings, ckpt=ckpt, log=lambda *_: None)
    v1, metas, vdir1 = _meta(settings, "k")
    first = sorted(metas)[0]
    assert _kw(vdir1, Path(first).stem) == [first]  # every item is findable by its file name
    more = tmp_path / "more"
    more.mkdir()
    Image.new("RGB", (64, 64), (200, 10, 10)).save(more / "zebra_crossing.png")
    add("k", images=more, settings=settings, ckpt=ckpt, log=lambda *_: None)
    v2, _, vdir2 = _meta(settings, "k")
    assert _kw(vdir2, "zebra") == ["zebra_crossing.png"] and _kw(vdir1, "zebra") == []  # the old file is unchanged
    delete("k", [first], settings=settings, log=lambda *_: None)
    v3, metas3, vdir3 = _meta(settings, "k")
    assert _kw(vdir3, Path(first).stem) == [] and _kw(vdir3, "zebra") == ["zebra_crossing.png"]
    n = keyword.KeywordIndex(vdir3 / keyword.DIR).count
    assert n == len(metas3)  # one row per item of the version: nothing lost, nothing doubled

    # the segments store the live items only: no deleted document kept (its words would be in the .store file)
    assert stored_docs(vdir3) == n and stored_docs(vdir2) == len(metas3) + 1


def test_an_index_keeps_its_ocr_through_add_unless_told_otherwise(settings, ckpt, tmp_path):
    sign(tmp_path / "a" / "first.jpg", "BAKERY")
    sign(tmp_path / "b" / "second.jpg", "MUSEUM")
    sign(tmp_path / "c" / "third.jpg", "GARAGE")
    build("o", images=tmp_path / "a", settings=settings.model_copy(update={"ocr": True}), ckpt=ckpt, log=lambda *_: None)
    assert settings.ocr is None  # unset: as the base version
    add("o", images=tmp_path / "b", settings=settings, ckpt=ckpt, log=lambda *_: None)
    _, metas, vdir = _meta(settings, "o")
    assert "MUSEUM" in metas["second.jpg"]["text"].upper()
    assert json.loads((vdir / "manifest.json").read_text())["ocr"] is True
    st = Store(settings, connect(settings))
    assert {v.words for v in st.versions("o")} == {"words+ocr"}  # what `crossprobe index list` shows
    add("o", images=tmp_path / "c", settings=settings.model_copy(update={"ocr": False}), ckpt=ckpt, log=lambda *_: None)
    _, metas, vdir = _meta(settings, "o")
    assert "text" not in metas["third.jpg"] and "BAKERY" in metas["first.jpg"]["text"].upper()  # kept items keep theirs
    assert json.loads((vdir / "manifest.json").read_text())["ocr"] is False


def test_an_item_whose_ocr_fails_is_indexed_and_counted(settings, ckpt, tmp_path, monkeypatch):
    sign(tmp_path / "p" / "good.jpg", "BAKERY")
    sign(tmp_path / "p" / "bad.jpg", "MUSEUM")
    real = ocr._photo

    def photo(path: str):
        if path.endswith("bad.jpg"):
            raise OSError("simulated: the file went away between decode and OCR")
        return real(path)
    monkeypatch.setattr(ocr, "_photo", photo)
    res = build("f", images=tmp_path / "p", settings=settings.model_copy(update={"ocr": True}), ckpt=ckpt,
                log=lambda *_: None)
    assert res.count == 2 and res.extra["ocr_failed"] == 1 and "OCR failed on 1 items" in res.summary()
    _, metas, vdir = _meta(settings, "f")
    assert "simulated" in metas["bad.jpg"]["text_error"] and "BAKERY" in metas["good.jpg"]["text"].upper()
    report = json.loads((vdir / "report.json").read_text())
    assert report["counts"]["ocr_failed"] == 1


def test_without_the_gate_every_photo_is_read(tmp_path):
    r = ocr.Reader(threshold=0)
    assert r.gate is None
    low = np.zeros(49, np.float32)  # cells the trained gate would stop
    assert "GARAGE" in r.read(str(sign(tmp_path / "g.jpg", "GARAGE")), low)["text"].upper()
    assert ocr.Reader().read(str(sign(tmp_path / "g.jpg", "GARAGE")), low) == {}
