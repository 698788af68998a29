"""Issue 34: every photo a library holds. HEIC / HEIF, AVIF and camera RAW (DNG, written by
benchmarks/library_files.py and read by LibRaw) are indexed; a 50 MP JPEG decodes at reduced size instead of
being skipped while a PNG over the limit is still refused; videos, other files, links that loop, files cut
short (still being written) and files or folders that cannot be read are counted skips with their reasons.

RAW coverage: DNG is the one RAW format that can be written without a camera maker's tools; the DNGs here
carry what cameras write (a JPEG preview, EXIF, an orientation) or nothing but the Bayer mosaic (then LibRaw
demosaics it). CR2, NEF, ARW... take the same LibRaw calls (open, extract_thumb, postprocess).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks import library_files
from crossprobe.indexer import build, open_index
from crossprobe.indexer.jobs.decode import decode_one
from crossprobe.indexer.jobs.sources import Item, scan_folder
from crossprobe.core import image_formats, inputs


def _no_log(*_):
    pass


@pytest.fixture()
def library(tmp_path) -> Path:
    """A camera roll as a phone or a camera card leaves it."""
    d = tmp_path / "roll"
    w = library_files.write
    w(d / "IMG_0001.HEIC", "heic", 640, 480, seed=1, taken="2021:07:04 10:11:12", thumbnails=[320])  # as iPhones write
    w(d / "IMG_0002.heic", "heic", 400, 300, seed=2)  # no thumbnail: decoded in full
    w(d / "IMG_0003.avif", "avif", 480, 360, seed=3, taken="2022:01:02 03:04:05")
    w(d / "raw" / "DSC_0004.DNG", "dng", 800, 600, seed=4, taken="2020:02:29 12:00:00")  # with a JPEG preview
    w(d / "raw" / "DSC_0005.dng", "dng", 320, 240, seed=5, preview=None)  # the mosaic only: demosaiced
    w(d / "raw" / "DSC_0006.dng", "dng", 640, 480, seed=6, preview=800, flip=6)  # shot in portrait
    w(d / "IMG_0007.jpg", "jpeg", 300, 200, seed=7)
    (d / "VID_0008.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 64)
    (d / "IMG_0009.MOV").write_bytes(b"\x00\x00\x00\x14ftypqt  " + b"\x00" * 64)
    (d / "IMG_0001.AAE").write_text("<plist/>")  # an iPhone's edit sidecar
    (d / "notes.txt").write_text("not a picture")
    (d / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")  # hidden: not counted
    full = (d / "IMG_0007.jpg").read_bytes()
    (d / "IMG_0010.jpg").write_bytes(full[: len(full) // 2])  # still being written
    heic = (d / "IMG_0002.heic").read_bytes()
    (d / "IMG_0011.heic").write_bytes(heic[: len(heic) // 2])
    (d / "renamed_video.jpg").write_bytes(b"\x00\x00\x00\x18ftypisom" + b"\x00" * 64)
    return d


def test_a_camera_roll_is_indexed_and_the_rest_counted(settings, library, ckpt, bert):
    res = build("roll", images=library, settings=settings, ckpt=ckpt, bert=bert, log=_no_log)
    assert res.count == 7, res.skipped
    assert res.skipped == {"video": 3, "not_image": 2, "truncated": 2}
    report = {x["id"]: x["reason"] for x in json.loads(res.report.read_text())["skipped"]}
    assert report == {"VID_0008.mp4": "video", "IMG_0009.MOV": "video", "renamed_video.jpg": "video",
                      "IMG_0001.AAE": "not_image", "notes.txt": "not_image", "IMG_0010.jpg": "truncated",
                      "IMG_0011.heic": "truncated"}
    rd = open_index("roll", None, settings)
    meta = dict(zip(rd.ids, rd.metadata(rd.ids)))
    assert {i: (m["format"], m["width"], m["height"]) for i, m in meta.items()} == {
        "IMG_0001.HEIC": ("HEIF", 640, 480), "IMG_0002.heic": ("HEIF", 400, 300), "IMG_0003.avif": ("AVIF", 480, 360),
        "raw/DSC_0004.DNG": ("DNG", 800, 600), "raw/DSC_0005.dng": ("DNG", 320, 240),
        "raw/DSC_0006.dng": ("DNG", 480, 640), "IMG_0007.jpg": ("JPEG", 300, 200)}
    assert meta["IMG_0001.HEIC"]["taken"] == "2021-07-04T10:11:12"
    assert meta["IMG_0003.avif"]["taken"] == "2022-01-02T03:04:05"
    assert meta["raw/DSC_0004.DNG"]["taken"] == "2020-02-29T12:00:00"
    assert meta["raw/DSC_0004.DNG"]["camera"] == "Crossprobe TestCam DNG"
    # the stored vectors are the model's on the pixels load_image makes of each file (every format one way)
    g = rd.vectors(rd.ids)
    assert np.allclose(np.linalg.norm(g, axis=1), 1, atol=1e-4)


def test_what_each_format_decodes(library):
    """RAW: the preview when it is at least 224 px on its short side (rotated by the file's orientation), else
    the mosaic demosaiced at half size; HEIC: its thumbnail when one is large enough."""
    def opened(name):
        with image_formats.open_path(library / name) as pic:
            return pic.format, pic.image.format, pic.image.size

    assert opened("raw/DSC_0004.DNG") == ("DNG", "JPEG", (512, 384))  # the 1024 px preview at JPEG draft 1/2
    assert opened("raw/DSC_0005.dng") == ("DNG", None, (160, 120))  # demosaiced at half size
    assert opened("IMG_0001.HEIC")[2] == (320, 240)  # the thumbnail
    assert opened("IMG_0002.heic")[2] == (400, 300)  # none: in full
    # portrait DNG: the preview is stored landscape, the orientation turns it upright
    x = inputs.load_image(library / "raw/DSC_0006.dng")
    with image_formats.open_path(library / "raw/DSC_0006.dng") as pic:
        assert pic.exif().get(0x0112) == 6
    assert x.shape == (3, 224, 224)
    # the DNG's preview and its demosaiced mosaic show the same picture (up to the raw pipeline's colour)
    src = np.asarray(library_files.picture(800, 600, 4).resize((224, 224)), np.float32)
    a = inputs.load_image(library / "raw/DSC_0004.DNG").transpose(1, 2, 0) * 128 + 127
    assert np.corrcoef(a.ravel(), src.ravel())[0, 1] > 0.95


def test_big_jpegs_decode_small_and_full_decodes_keep_the_guard(tmp_path):
    """max_pixels counts what decoding produces: a JPEG at its draft scale is indexed where a PNG of the same size
    (which must decode in full) is refused."""
    img = library_files.picture(2000, 1500)
    img.save(tmp_path / "big.jpg", quality=85)
    img.save(tmp_path / "big.png")
    ok = decode_one(Item("big.jpg", str(tmp_path / "big.jpg")), 1_000_000)
    assert not hasattr(ok, "reason") and ok[1]["width"] == 2000 and ok[1]["height"] == 1500
    skip = decode_one(Item("big.png", str(tmp_path / "big.png")), 1_000_000)
    assert skip.reason == "oversized" and "decodes at 2000x1500" in skip.error and "MAX_PIXELS" in skip.error


def test_a_50_megapixel_photo_is_indexed_at_the_default_limit(tmp_path):
    """8160 x 6120, a phone's default 50 MP: decoded at 1/8 scale (1020 x 765), not skipped."""
    from crossprobe.indexer.jobs.settings import IndexerSettings

    library_files.write(tmp_path / "50mp.jpg", "jpeg", 8160, 6120, quality=80)
    r = decode_one(Item("50mp.jpg", str(tmp_path / "50mp.jpg")), IndexerSettings().max_pixels)
    assert not hasattr(r, "reason"), r
    assert (r[1]["width"], r[1]["height"]) == (8160, 6120) and r[0].shape == (3, 224, 224)


def _linked_library(tmp_path: Path) -> Path:
    d = tmp_path / "lib"
    library_files.write(d / "a.jpg", "jpeg", 64, 48)
    library_files.write(d / "inner" / "c.jpg", "jpeg", 64, 48)
    library_files.write(tmp_path / "elsewhere" / "b.jpg", "jpeg", 64, 48)
    library_files.write(tmp_path / "secret.jpg", "jpeg", 64, 48)
    os.symlink(tmp_path / "elsewhere", d / "album")  # an album linked in from outside the library
    os.symlink(tmp_path / "secret.jpg", d / "peek.jpg")  # a file outside, linked in by whoever may write here
    os.symlink(d / "inner", d / "shortcut")  # a link that stays inside: followed
    os.symlink(d, d / "inner" / "back")  # a link back up the path: a loop, not walked forever
    os.symlink("self.jpg", d / "self.jpg")  # a link to itself
    os.symlink("selfdir", d / "selfdir")
    os.symlink(d / "nowhere.jpg", d / "gone.jpg")  # dangling, inside
    return d


def test_links_that_leave_the_folder_are_skipped_and_counted(tmp_path):
    """The default (follow_links inside): a link whose target lies outside the folder, to a file or a folder, is
    a counted link_outside skip with where it leads; links inside are followed; loops are counted."""
    d = _linked_library(tmp_path)
    items, skips = scan_folder(d)
    assert sorted(i.id for i in items) == ["a.jpg", "gone.jpg", "inner/c.jpg", "self.jpg", "shortcut/c.jpg"]
    got = {s.id: s for s in skips}
    assert {k: s.reason for k, s in got.items()} == {
        "album/": "link_outside", "peek.jpg": "link_outside", "inner/back/": "symlink_loop",
        "shortcut/back/": "symlink_loop", "selfdir": "symlink_loop"}
    assert str(tmp_path / "secret.jpg") in got["peek.jpg"].error and f"outside {d}" in got["peek.jpg"].error
    why = {i.id: decode_one(i, 10 ** 8) for i in items}
    assert why["self.jpg"].reason == "symlink_loop" and why["gone.jpg"].reason == "missing"


def test_follow_links_all_walks_linked_albums(tmp_path):
    d = _linked_library(tmp_path)
    items, skips = scan_folder(d, follow_links="all")
    assert {"album/b.jpg", "peek.jpg"} <= {i.id for i in items}
    assert not [s for s in skips if s.reason == "link_outside"]


def _stages(folder: Path) -> dict[str, str]:
    """The reader and decode stages over a folder -> id -> indexed, or the skip's reason."""
    items, skips = scan_folder(folder)
    out = {s.id: s.reason for s in skips}
    out.update({i.id: getattr(decode_one(i, 10 ** 8), "reason", "indexed") for i in items})
    return out


def test_unreadable_files_and_folders_are_counted():
    """chmod 000 stops no root process (CAP_DAC_OVERRIDE): as root, the stages run with the effective user and
    group of the unprivileged nobody (seteuid: the kernel's permission checks then apply, as they do to a
    library owned by another user), and root is taken back afterwards (the real and saved user ids stay 0)."""
    d = Path(tempfile.mkdtemp(prefix="crossprobe-perm-"))
    try:
        os.chmod(d, 0o755)
        for p in (d / "ok.jpg", d / "secret.jpg", d / "locked" / "c.jpg"):
            library_files.write(p, "jpeg", 64, 48)
            os.chmod(p, 0o644)
        os.chmod(d / "locked", 0o755)
        _stages(d)  # once with access: every module the stages import is imported now
        os.chmod(d / "secret.jpg", 0)
        os.chmod(d / "locked", 0)
        if os.geteuid() == 0:
            os.setegid(65534)
            os.seteuid(65534)
            try:
                got = _stages(d)
            finally:
                os.seteuid(0)
                os.setegid(0)
        else:
            got = _stages(d)
        assert got == {"ok.jpg": "indexed", "secret.jpg": "unreadable", "locked/": "unreadable"}
    finally:
        os.chmod(d / "locked", 0o755)
        subprocess.run(["rm", "-rf", str(d)], check=False)


def test_added_is_kept_by_a_rebuild_and_a_reindex(settings, tmp_path, ckpt, bert):
    """"added" is when an id first entered the index: a rebuild of the same folder and a reindex keep it; a new
    file gets its own, later time."""
    import time

    from crossprobe.indexer import reindex

    d = tmp_path / "g"
    for n in range(2):
        library_files.write(d / f"p{n}.jpg", "jpeg", 64, 48, seed=n)
    build("k", images=d, settings=settings, ckpt=ckpt, bert=bert, log=_no_log)
    rd = open_index("k", None, settings)
    first = {i: m["added"] for i, m in zip(rd.ids, rd.metadata(rd.ids))}
    time.sleep(1.1)  # "added" has whole seconds
    library_files.write(d / "p2.jpg", "jpeg", 64, 48, seed=2)
    build("k", images=d, settings=settings, ckpt=ckpt, bert=bert, log=_no_log)
    rd = open_index("k", None, settings)
    again = {i: m["added"] for i, m in zip(rd.ids, rd.metadata(rd.ids))}
    assert {i: again[i] for i in first} == first and again["p2.jpg"] > max(first.values())
    reindex("k", settings=settings, ckpt=ckpt, bert=bert, log=_no_log)
    rd = open_index("k", None, settings)
    assert {i: m["added"] for i, m in zip(rd.ids, rd.metadata(rd.ids))} == again
