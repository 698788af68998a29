"""Photo-library files made on the spot, for the tests and benchmarks/formats_bench.py: JPEG, HEIC, AVIF (written
by Pillow and pillow-heif) and camera RAW as DNG, written here by hand.

A DNG is a TIFF whose first directory (IFD0) carries the DNG tags (DNGVersion, UniqueCameraModel, a colour
matrix) and, as cameras and Adobe's converter write it, a JPEG preview of the picture (NewSubFileType 1); its
SubIFDs tag points at the raw directory: the sensor's 16-bit Bayer mosaic (PhotometricInterpretation CFA,
CFARepeatPatternDim 2 x 2, CFAPattern RGGB), uncompressed. LibRaw reads both (the tests check that it does:
rawpy's extract_thumb gives the preview and postprocess demosaics the mosaic). No camera maker's own RAW (CR2,
NEF, ARW...) can be written without that maker's tools; those go through the same LibRaw calls.
"""
from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
from PIL import Image

# TIFF field types: (code, struct format of one value)
_TYPES = {"B": (1, "B"), "A": (2, "c"), "H": (3, "H"), "I": (4, "I"), "R": (5, "II"), "SR": (10, "ii")}


def picture(width: int, height: int, seed: int = 0, grain: int = 0) -> Image.Image:
    """A smooth random picture (blocks of colour blended: compresses like a photo, not like noise); grain: the
    amplitude of per-pixel noise added, as a sensor's (a 50 MP JPEG with grain 8 is ~10 MB, as a phone's is:
    the entropy decoder's work, which draft mode does not save, grows with it)."""
    rng = np.random.default_rng(seed)
    small = (rng.random((height // 256 + 2, width // 256 + 2, 3)) * 255).astype(np.uint8)
    img = Image.fromarray(small).resize((width, height), Image.BILINEAR)
    if grain:
        arr = np.asarray(img, np.int16)
        for row in range(0, height, 512):  # in strips: a 200 MP picture's noise at once would take GBs
            part = arr[row:row + 512]
            part += rng.integers(-grain, grain + 1, part.shape, dtype=np.int16)
        img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    return img


def exif_bytes(taken: str | None = None, make: str = "Crossprobe", model: str = "TestCam 1") -> bytes:
    """An EXIF block with Make, Model and (when given, "2021:07:04 10:11:12") DateTimeOriginal."""
    ex = Image.Exif()
    ex[0x010F], ex[0x0110] = make, model
    if taken:
        ex.get_ifd(0x8769)[0x9003] = taken
    return ex.tobytes()


def _ifd(entries: list[tuple[int, str, list]], at: int, nxt: int = 0) -> tuple[bytes, bytes]:
    """One little-endian TIFF directory at offset `at` -> (directory bytes, its out-of-line values), the values
    placed right after the directory."""
    entries = sorted(entries)
    head = struct.pack("<H", len(entries))
    extra = b""
    data_at = at + 2 + 12 * len(entries) + 4
    for tag, typ, vals in entries:
        code, fmt = _TYPES[typ]
        if typ == "A":
            raw = vals.encode() + b"\x00" if isinstance(vals, str) else bytes(vals)
            count = len(raw)
        else:
            raw = b"".join(struct.pack("<" + fmt, *(v if isinstance(v, tuple) else (v,))) for v in vals)
            count = len(vals)
        if len(raw) <= 4:
            head += struct.pack("<HHI", tag, code, count) + raw.ljust(4, b"\x00")
        else:
            if (data_at + len(extra)) % 2:
                extra += b"\x00"
            head += struct.pack("<HHII", tag, code, count, data_at + len(extra))
            extra += raw
    return head + struct.pack("<I", nxt), extra


def dng_bytes(width: int, height: int, seed: int = 0, preview: int | None = 1024, taken: str | None = None,
              flip: int = 1, grain: int = 0) -> bytes:
    """A valid DNG of width x height sensor pixels; `preview`: the longer side of its embedded JPEG preview
    (None: no preview, so a reader must demosaic); `taken`: its EXIF DateTimeOriginal ("YYYY:MM:DD HH:MM:SS");
    flip: the TIFF Orientation of the raw image (1: upright, 6: rotate 90 CW to view)."""
    rng = np.random.default_rng(seed)
    # a Bayer mosaic of a smooth picture: the green / red / blue sites of an RGGB pattern from its channels
    rgb = np.asarray(picture(width, height, seed), np.uint16) * 64  # 14-bit range in 16-bit samples (noise: below)
    cfa = np.empty((height, width), np.uint16)
    cfa[0::2, 0::2] = rgb[0::2, 0::2, 0]
    cfa[0::2, 1::2] = rgb[0::2, 1::2, 1]
    cfa[1::2, 0::2] = rgb[1::2, 0::2, 1]
    cfa[1::2, 1::2] = rgb[1::2, 1::2, 2]
    cfa += rng.integers(0, 64, cfa.shape, dtype=np.uint16)  # sensor noise
    raw = cfa.tobytes()
    jpeg = b""
    if preview:
        s = preview / max(width, height)
        pv = picture(width, height, seed).resize((max(1, round(width * s)), max(1, round(height * s))))
        buf = io.BytesIO()
        pv.save(buf, "JPEG", quality=85)
        jpeg = buf.getvalue()
    ident = [(271, "A", "Crossprobe"), (272, "A", "TestCam DNG"), (274, "H", [flip]),
             (50706, "B", [1, 4, 0, 0]), (50707, "B", [1, 1, 0, 0]), (50708, "A", "Crossprobe TestCam DNG"),
             (50721, "SR", [(1, 1), (0, 1), (0, 1), (0, 1), (1, 1), (0, 1), (0, 1), (0, 1), (1, 1)]),  # ColorMatrix1
             (50728, "R", [(1, 1), (1, 1), (1, 1)]), (50778, "H", [21])]  # AsShotNeutral, illuminant D65
    if taken:
        ident.append((306, "A", taken))
    raw_tags = [(254, "I", [0]), (256, "I", [width]), (257, "I", [height]), (258, "H", [16]), (259, "H", [1]),
                (262, "H", [32803]), (277, "H", [1]), (278, "I", [height]), (284, "H", [1]),
                (33421, "H", [2, 2]), (33422, "B", [0, 1, 1, 2]), (50717, "I", [16383])]
    # layout: header | IFD0 + values | [EXIF IFD + values] | raw IFD + values | preview JPEG | raw data
    # (two passes: offsets depend on the sizes of the directories, which do not depend on the offsets' values)
    def build(off_exif: int, off_raw_ifd: int, off_jpeg: int, off_raw: int) -> tuple[bytes, bytes, bytes]:
        if jpeg:
            pw, ph = Image.open(io.BytesIO(jpeg)).size
            ifd0 = [(254, "I", [1]), (256, "I", [pw]), (257, "I", [ph]), (258, "H", [8, 8, 8]), (259, "H", [7]),
                    (262, "H", [6]), (273, "I", [off_jpeg]), (277, "H", [3]), (278, "I", [ph]),
                    (279, "I", [len(jpeg)]), (330, "I", [off_raw_ifd])] + ident
            rawifd = raw_tags + [(273, "I", [off_raw]), (279, "I", [len(raw)])]
        else:  # the raw image itself in IFD0
            ifd0 = raw_tags + ident + [(273, "I", [off_raw]), (279, "I", [len(raw)])]
            rawifd = None
        if taken:
            ifd0.append((34665, "I", [off_exif]))
        d0, v0 = _ifd(ifd0, 8)
        ex = b"".join(_ifd([(36867, "A", taken)], off_exif)) if taken else b""
        r = b"".join(_ifd(rawifd, off_raw_ifd)) if rawifd else b""
        return d0 + v0, ex, r

    a, ex, r = build(0, 0, 0, 0)
    off_exif = 8 + len(a) + (len(a) % 2)
    off_raw_ifd = off_exif + len(ex) + (len(ex) % 2)
    off_jpeg = off_raw_ifd + len(r) + (len(r) % 2)
    off_raw = off_jpeg + len(jpeg) + (len(jpeg) % 2)
    a, ex, r = build(off_exif, off_raw_ifd, off_jpeg, off_raw)
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    for part, at in ((a, 8), (ex, off_exif), (r, off_raw_ifd), (jpeg, off_jpeg), (raw, off_raw)):
        out += b"\x00" * (at - len(out))
        out += part
    return bytes(out)


def write(path: Path, kind: str, width: int, height: int, seed: int = 0, taken: str | None = None,
          **opts) -> Path:
    """path <- one file of `kind`: jpeg | png | heic (opts: thumbnails=[320], as phones write them; over 2000 px a
    grid of 512 px tiles, as an iPhone writes it) | avif | dng
    (opts: preview, flip); `taken` ("YYYY:MM:DD HH:MM:SS") goes into its EXIF; opts grain: picture()'s."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dng":
        path.write_bytes(dng_bytes(width, height, seed, taken=taken, **opts))
        return path
    img = picture(width, height, seed, opts.get("grain", 0))
    exif = exif_bytes(taken) if taken else None
    extra = {"exif": exif} if exif else {}
    if kind == "jpeg":
        img.save(path, "JPEG", quality=opts.get("quality", 88), **extra)
    elif kind == "png":
        img.save(path, "PNG", **extra)
    elif kind == "heic":
        from crossprobe.core import image_formats  # registers pillow-heif

        image_formats.register()
        big = max(width, height) > 2000  # as phones write a large picture: a grid of 512 px tiles (iPhone),
        # which also keeps each HEVC frame within what libde265 decodes (one 50 MP frame of a grainy picture fails)
        img.save(path, "HEIF", quality=opts.get("quality", 70), thumbnails=opts.get("thumbnails", []),
                 enc_params={"preset": "ultrafast"} if big else {}, **({"tile_size": 512} if big else {}), **extra)
    elif kind == "avif":
        img.save(path, "AVIF", quality=opts.get("quality", 60), speed=opts.get("speed", 10), **extra)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    return path
