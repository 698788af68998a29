"""Hostile image files, made from nothing (issue 55): headers that declare far more than the file holds, for the
tests of crossprobe.core.image_formats' limits and benchmarks/hostile_inputs.py's table. Each is built without
ever holding what it declares."""
from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def png_zeros(width: int, height: int) -> bytes:
    """A grayscale PNG of zeros, compressed row by row."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    z, row, parts = zlib.compressobj(9), b"\x00" * (width + 1), []
    for _ in range(height):
        parts.append(z.compress(row))
    parts.append(z.flush())
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"".join(parts)) + chunk(b"IEND", b"")


def tiff(width: int, height: int, extra: dict | None = None, bps: int = 8, photometric: int = 1,
         compression: int = 8) -> bytes:
    """A little-endian TIFF whose one IFD declares width x height, with one small strip. extra: {tag: (type, count,
    value)}, a value an int or up to 4 bytes held in the entry itself."""
    strip = zlib.compress(b"\x00" * 4096) if compression == 8 else b"\x00" * 4096
    tags = {256: (4, 1, width), 257: (4, 1, height), 258: (3, 1, bps), 259: (3, 1, compression),
            262: (3, 1, photometric), 273: (4, 1, 0), 277: (3, 1, 1), 278: (4, 1, height), 279: (4, 1, len(strip)),
            **(extra or {})}
    items = sorted(tags.items())
    ifd_at = 8
    data_at = ifd_at + 2 + 12 * len(items) + 4
    out = bytearray(b"II*\x00" + struct.pack("<I", ifd_at) + struct.pack("<H", len(items)))
    for tag, (typ, count, value) in items:
        value = data_at if tag == 273 else value
        if isinstance(value, bytes):
            field = value.ljust(4, b"\x00")
        elif typ == 3 and count == 1:
            field = struct.pack("<HH", value, 0)
        else:
            field = struct.pack("<I", value)
        out += struct.pack("<HHI", tag, typ, count) + field
    out += struct.pack("<I", 0) + strip
    return bytes(out)


def dng(width: int, height: int) -> bytes:
    """A DNG that LibRaw reads as one (DNGVersion 1.4, a maker, a 2 x 2 CFA of 16-bit photosites) declaring
    width x height photosites, with 4 KB of data."""
    return tiff(width, height, {50706: (1, 4, b"\x01\x04\x00\x00"), 33421: (3, 2, struct.pack("<HH", 2, 2)),
                                33422: (1, 4, b"\x00\x01\x01\x02"), 271: (2, 4, b"Abc\x00")},
                bps=16, photometric=32803, compression=1)


def heif_declaring(side: int) -> bytes:
    """A 64 x 64 HEIF whose ispe box (the image's spatial extent) declares side x side."""
    import pillow_heif

    buf = io.BytesIO()
    pillow_heif.from_pillow(Image.new("RGB", (64, 64), (90, 120, 150))).save(buf, format="HEIF", quality=50)
    data = bytearray(buf.getvalue())
    at = data.find(b"ispe")  # a FullBox: version and flags (4 bytes), then width and height, 32 bits each
    if at < 0:
        raise ValueError("the encoder wrote no ispe box")
    data[at + 8:at + 16] = struct.pack(">II", side, side)
    return bytes(data)


def gif_frames(frames: int, side: int = 64) -> bytes:
    """An animated GIF of `frames` frames, each one pixel different from the last (so none is merged away)."""
    imgs = []
    for i in range(frames):
        im = Image.new("L", (side, side), 0)
        im.putpixel((i % side, (i // side) % side), 255)
        imgs.append(im)
    buf = io.BytesIO()
    imgs[0].save(buf, "GIF", save_all=True, append_images=imgs[1:], duration=10, loop=0)
    return buf.getvalue()
