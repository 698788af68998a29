"""Every format a photo library holds, opened one way for the indexer (indexer/jobs/decode.py), query images
(service/query_image.py) and the item thumbnails (service/images.py).

  JPEG, PNG, WebP, GIF, BMP, TIFF   Pillow
  AVIF                              Pillow's own plugin (Pillow >= 11.3 ships libavif in its wheels)
  HEIC / HEIF                       pillow-heif (libheif + libde265, in its wheels), registered here
  camera RAW (DNG, CR2, CR3, NEF,   rawpy (LibRaw, in its wheels): the embedded preview where the file has one at
  ARW, RAF, ORF, RW2, PEF, ...)     least IMAGE_SIZE px on its short side (cameras write a JPEG of 1-2 MP up to
                                    full size), else the sensor data demosaiced at half size

Reduced decoding: open_picture() calls draft() before any pixel is decoded, so a JPEG is decoded by libjpeg
at 1/2, 1/4 or 1/8 scale (a 200 MP photo as 3 MP) and a HEIC with an embedded thumbnail at least as large
as the target decodes only the thumbnail. A model whose reference decodes the full picture (every exported
family: open_clip, Hugging Face, Immich) asks for reduce=False: its pixels are then the reference's, and
Picture.fit() reduces a JPEG only as far as a pixel limit needs (docs/research/decode.md measures both ways).
The image's size after that is what the decode will really cost, and the callers' pixel limits (the indexer's
max_pixels, the service's image_max_pixels / query_image_max_pixels) are checked against it: the
decompression-bomb guard stays for every format that must decode in full (PNG, TIFF, WebP, AVIF, a HEIC without
thumbnail), and no longer refuses a big photo that decodes small.

Pillow's own guard (Image.MAX_IMAGE_PIXELS, a process-wide setting left as it is) refuses in Image.open any
header over ~179 MP, before draft() can act: JPEG and HEIF files are therefore opened by their plugin
classes directly (which is what Image.open does after identifying them, minus that check), and every other
format goes through Image.open, its guard included.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from PIL import Image, JpegImagePlugin, features

PILLOW_EXTS = {".jpg", ".jpeg", ".jpe", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
HEIF_EXTS = {".heic", ".heif", ".hif"}
AVIF_EXTS = {".avif"}
RAW_EXTS = {
    ".dng",
    ".cr2",
    ".cr3",
    ".crw",
    ".nef",
    ".nrw",
    ".arw",
    ".srf",
    ".sr2",
    ".raf",
    ".orf",
    ".rw2",
    ".pef",
    ".srw",
    ".x3f",
    ".3fr",
    ".iiq",
    ".rwl",
    ".erf",
    ".kdc",
    ".mrw",
    ".mos",
    ".dcr",
}
IMAGE_EXTS = PILLOW_EXTS | HEIF_EXTS | AVIF_EXTS | RAW_EXTS
# what a phone's camera roll holds besides photos: counted as "video" skips by the folder walk, never opened
VIDEO_EXTS = {
    ".mp4",
    ".mov",
    ".m4v",
    ".avi",
    ".mkv",
    ".3gp",
    ".3g2",
    ".mts",
    ".m2ts",
    ".webm",
    ".wmv",
    ".mpg",
    ".mpeg",
    ".flv",
    ".insv",
    ".lrv",
}
# the names a browser / an API client may give these formats (the page's file picker, docs)
MIME_TYPES = (
    "image/jpeg",
    "image/png",
    "image/webp",
    "image/gif",
    "image/bmp",
    "image/tiff",
    "image/heic",
    "image/heif",
    "image/avif",
    "image/x-adobe-dng",
)
FORMATS_TEXT = "JPEG, PNG, WebP, GIF, BMP, TIFF, HEIC/HEIF, AVIF or camera RAW (DNG, CR2, CR3, NEF, ARW, RAF, ORF...)"

_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1", b"mif2"}
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*")
_registered = False


def register() -> None:
    """Make Pillow read HEIC / HEIF (pillow-heif) and AVIF (Pillow's own plugin, or pillow-avif-plugin on an
    older Pillow). Idempotent; called on import of this module, so any code that opens images through it (or
    through models.inputs) reads every format."""
    global _registered
    if _registered:
        return
    import pillow_heif

    pillow_heif.register_heif_opener()  # thumbnails on (its default): draft() can pick one
    if not features.check("avif"):
        try:
            import pillow_avif  # noqa: F401 - registers itself
        except ImportError:  # pragma: no cover - Pillow >= 11.3 (pyproject's floor) has AVIF
            pass
    _registered = True


register()


class NotAnImage(ValueError):
    """Bytes that no reader here identifies (Pillow's UnidentifiedImageError, LibRaw's unsupported file)."""


@dataclass
class Picture:
    """An opened image file: `image` is lazy (header only) until loaded; after prepare(), image.size is what
    decoding it will produce. width / height / format describe the original file (a RAW's sensor image, upright,
    not its preview)."""

    image: Image.Image
    width: int
    height: int
    format: str
    raw_exif: Image.Exif | None = None  # a RAW's EXIF, read off its TIFF container (else: the preview's)
    _closing: list = field(default_factory=list)

    def exif(self) -> Image.Exif:
        """The file's EXIF (date taken, camera, orientation): a RAW's own, else the image's."""
        return self.raw_exif if self.raw_exif else self.image.getexif()

    def prepare(self, size: int) -> None:
        """Ask for reduced decoding (JPEG draft scale, a HEIF thumbnail) to no less than size x size."""
        self.image.draft("RGB", (size, size))

    def fit(self, max_pixels: int) -> None:
        """Where the full picture decodes to more than max_pixels, reduce it (JPEG draft at 1/2, 1/4 or 1/8; a
        HEIF thumbnail) by the least that fits; a no-op when it fits, or for a format that cannot reduce (its
        size stays over the limit, and the caller refuses it)."""
        w, h = self.image.size
        for scale in (2, 4, 8):
            if w * h <= max_pixels:
                return
            if (w // scale) * (h // scale) <= max_pixels:
                self.image.draft("RGB", (max(1, w // scale), max(1, h // scale)))
                return

    def decode_pixels(self) -> int:
        """What decoding will hold, in pixels of RGB (3 bytes each), known before any pixel is decoded: the
        image's size as it will decode (after draft / fit), except a progressive JPEG, which libjpeg decodes through
        a coefficient buffer of the FULL picture whatever the draft scale (2 bytes per DCT coefficient, per
        component at its own sampling): a 767 KB progressive JPEG of 14000 x 14000 holds ~390 MB however small it
        is asked to decode. The callers check their pixel limits against this."""
        w, h = self.image.size
        if self.image.format == "JPEG" and self.image.info.get("progressive"):
            fw, fh = self.width, self.height
            layers = getattr(self.image, "layer", None) or [(0, 1, 1, 0)] * len(self.image.getbands())
            hmax, vmax = max(lay[1] for lay in layers), max(lay[2] for lay in layers)
            coef = sum(-(-fw * lay[1] // (hmax * 8)) * -(-fh * lay[2] // (vmax * 8)) * 128 for lay in layers)
            return max(w * h, -(-coef // 3))
        return w * h

    def over(self, max_pixels: int) -> str | None:
        """Why decoding would hold more than max_pixels (decode_pixels), in words; None when it fits."""
        n, (w, h) = self.decode_pixels(), self.image.size
        if n <= max_pixels:
            return None
        if n > w * h:
            return (
                f"{self.width}x{self.height} progressive JPEG decodes through its full-size coefficients, "
                f"{n} pixels' worth"
            )
        return f"{self.width}x{self.height} {self.format} decodes at {w}x{h} = {n} pixels"

    def close(self) -> None:
        for c in (self.image, *self._closing):
            try:
                if c is not None:
                    c.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass

    def __enter__(self) -> "Picture":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _pillow(fp: BinaryIO) -> Image.Image:
    """Open with Pillow, lazily. JPEG and HEIF by their plugin classes (no open-time pixel guard: draft() makes
    their decode small, and the callers check the drafted size); everything else by Image.open, guard included."""
    head = fp.read(16)
    fp.seek(0)
    if head[:3] == b"\xff\xd8\xff":
        try:
            return JpegImagePlugin.JpegImageFile(fp)
        except (SyntaxError, OSError, ValueError):
            fp.seek(0)
    if head[4:8] == b"ftyp" and head[8:12] in _HEIF_BRANDS:
        from pillow_heif.as_plugin import HeifImageFile

        try:
            return HeifImageFile(fp)
        except (SyntaxError, OSError, ValueError, RuntimeError):
            fp.seek(0)
    try:
        return Image.open(fp)
    except Image.UnidentifiedImageError as e:
        raise NotAnImage(str(e)) from None


def _looks_raw(head: bytes) -> bool:
    """RAW containers recognisable from their first bytes: TIFF-based (DNG, CR2, NEF, ARW, PEF... and plain TIFF:
    LibRaw is asked first and a plain TIFF falls back to Pillow), Fujifilm RAF, Olympus ORF, Panasonic RW2,
    Canon CR3."""
    return (
        head[:4] in _TIFF_MAGIC
        or head.startswith(b"FUJIFILMCCD-RAW")
        or head[:4] in (b"IIRO", b"IIRS", b"MMOR")
        or head[:4] == b"IIU\x00"
        or (head[4:8] == b"ftyp" and head[8:12] == b"crx ")
    )


def image_magic(head: bytes) -> bool:
    """Whether the first bytes of a file are an image format's signature (JPEG, PNG, GIF, BMP, WebP, TIFF or a RAW
    container, HEIF, AVIF): a file that starts so and whose reader says its data ended early is cut short (a file
    still being written), not "no image"."""
    return (
        head[:3] == b"\xff\xd8\xff"
        or head[:8] == b"\x89PNG\r\n\x1a\n"
        or head[:4] in (b"GIF8",)
        or head[:2] == b"BM"
        or (head[:4] == b"RIFF" and head[8:12] == b"WEBP")
        or _looks_raw(head)
        or (head[4:8] == b"ftyp" and head[8:12] in _HEIF_BRANDS | {b"avif", b"avis"})
    )


# LibRaw's flip -> the EXIF orientation that shows the picture upright (0: none, 3: 180, 5: 90 CCW, 6: 90 CW)
_FLIP_TO_ORIENTATION = {3: 3, 5: 8, 6: 6}


class Oversized(ValueError):
    """A file whose decode would hold more than the caller's pixel limit, known from its header alone."""


def _raw(fp: BinaryIO, size: int, max_pixels: int | None = None) -> Picture:
    """A camera RAW file -> its embedded preview (lazy when JPEG), or the sensor data demosaiced at half size.
    LibRaw reads the header when it opens the file; nothing is decoded before the sizes it declares are checked
    against max_pixels (a crafted file can declare any): the sensor data (2 bytes per photosite while it is
    unpacked) and a bitmap preview (3 bytes per pixel). A JPEG preview is lazy, checked by the caller like any
    JPEG."""
    import numpy as np
    import rawpy

    data = fp.read()
    try:
        raw = rawpy.imread(io.BytesIO(data))
    except rawpy.LibRawFileUnsupportedError as e:
        raise NotAnImage(f"LibRaw: {e}") from None
    with raw:
        s = raw.sizes
        w, h = (s.height, s.width) if s.flip in (5, 6) else (s.width, s.height)
        sensor = max(s.raw_width * s.raw_height, w * h) * 2 // 3  # in RGB pixels' worth of bytes
        if max_pixels is not None and sensor > max_pixels:
            raise Oversized(
                f"{w}x{h} RAW ({s.raw_width}x{s.raw_height} photosites) holds {sensor} pixels' worth while LibRaw "
                f"decodes it"
            )
        img: Image.Image | None = None
        try:
            thumb = raw.extract_thumb()
        except (rawpy.LibRawNoThumbnailError, rawpy.LibRawUnsupportedThumbnailError):
            thumb = None
        if thumb is not None and thumb.format == rawpy.ThumbFormat.JPEG:
            try:
                prev = JpegImagePlugin.JpegImageFile(io.BytesIO(bytes(thumb.data)))
                if min(prev.size) >= size:
                    img = prev
                    tags = img.getexif()  # cached on the image: exif_transpose reads the same object
                    if tags.get(0x0112, 1) == 1 and s.flip in _FLIP_TO_ORIENTATION:
                        tags[0x0112] = _FLIP_TO_ORIENTATION[s.flip]
            except (SyntaxError, OSError, ValueError):
                img = None
        elif thumb is not None and thumb.format == rawpy.ThumbFormat.BITMAP:  # already decoded: bounded above
            bitmap = np.asarray(thumb.data)
            if min(bitmap.shape[:2]) >= size:
                img = Image.fromarray(np.ascontiguousarray(bitmap[..., :3]).astype(np.uint8))
                img = {
                    3: img.transpose(Image.Transpose.ROTATE_180),
                    5: img.transpose(Image.Transpose.ROTATE_90),
                    6: img.transpose(Image.Transpose.ROTATE_270),
                }.get(s.flip, img)
        if img is None:  # no usable preview: demosaic (LibRaw rotates by the file's flip itself)
            img = Image.fromarray(raw.postprocess(half_size=True, use_camera_wb=True, output_bps=8))
    exif: Image.Exif | None = None
    if data[:4] in _TIFF_MAGIC:  # EXIF (date taken, camera) from the TIFF container's own directories
        try:
            exif = Image.Exif()
            exif.load(data)
        except Exception:  # noqa: BLE001 - no EXIF is no reason to lose the picture
            exif = None
    return Picture(img, w, h, "RAW", exif)


def open_picture(
    fp: BinaryIO, name: str | None = None, size: int = 224, reduce: bool = True, max_pixels: int | None = None
) -> Picture:
    """An image file (a binary file object, positioned at its start) -> a Picture whose image is lazy and, with
    reduce, already prepared for reduced decoding to no less than size x size (reduce=False: the full picture,
    as a model whose reference decodes it so needs; a RAW still gives its preview). `name` (a path or an upload's
    file name) decides by extension when it names a RAW or a Pillow format; without one the first bytes decide (RAW
    containers are tried with LibRaw first; a plain TIFF falls back to Pillow). NotAnImage when nothing here reads
    it. max_pixels: a RAW whose header declares more is refused (Oversized) before LibRaw decodes anything; every
    other format is lazy, and the caller checks Picture.over() before decoding it."""
    ext = os.path.splitext(name or "")[1].lower()
    head = fp.read(16)
    fp.seek(0)
    if ext in RAW_EXTS or (ext not in PILLOW_EXTS | HEIF_EXTS | AVIF_EXTS and _looks_raw(head)):
        try:
            pic = _raw(fp, size, max_pixels)
            pic.format = ext[1:].upper() if ext in RAW_EXTS else pic.format
            if reduce:
                pic.prepare(size)
            return pic
        except NotAnImage:
            if ext in RAW_EXTS:
                raise
            fp.seek(0)
    img = _pillow(fp)
    pic = Picture(img, img.size[0], img.size[1], img.format or "unknown")
    if reduce:
        pic.prepare(size)
    return pic


def open_path(path: str | Path, size: int = 224, reduce: bool = True, max_pixels: int | None = None) -> Picture:
    """open_picture on a file by its path (the file stays open until the Picture is closed)."""
    f = open(path, "rb")
    try:
        pic = open_picture(f, str(path), size, reduce, max_pixels)
    except BaseException:
        f.close()
        raise
    pic._closing.append(f)
    return pic
