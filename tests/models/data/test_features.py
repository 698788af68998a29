import numpy as np
import pytest
from PIL import Image

from crossprobe.models.data.features import ChunkedCache
from crossprobe.core import inputs


def test_chunked_cache_resumes_after_a_kill(tmp_path):
    path = tmp_path / "x.npy"
    c = ChunkedCache(path, (10, 3), np.float32)
    c.commit(0, np.ones((4, 3)))
    del c  # "killed": a new process opens the same cache
    c2 = ChunkedCache(path, (10, 3), np.float32)
    assert c2.done == 4 and not c2.complete
    c2.commit(4, 2 * np.ones((6, 3)))
    assert c2.complete
    arr = np.load(path)
    assert (arr[:4] == 1).all() and (arr[4:] == 2).all()


def test_chunked_cache_refuses_another_shape(tmp_path):
    ChunkedCache(tmp_path / "x.npy", (10, 3), np.float32)
    with pytest.raises(ValueError, match="shape"):
        ChunkedCache(tmp_path / "x.npy", (11, 3), np.float32)


def test_load_image_honours_exif_orientation_and_converts_to_rgb(tmp_path):
    # left half red, right half blue; EXIF orientation 3 = rotated 180 degrees
    arr = np.zeros((40, 80, 3), np.uint8)
    arr[:, :40] = (255, 0, 0)
    arr[:, 40:] = (0, 0, 255)
    img = Image.fromarray(arr)
    exif = Image.Exif()
    exif[0x0112] = 3
    img.save(tmp_path / "rot.jpg", exif=exif.tobytes(), quality=95)
    x = inputs.load_image(tmp_path / "rot.jpg")
    assert x.shape == (3, 224, 224) and x.dtype == np.float32
    # after honouring the tag, blue is on the left
    assert x[2, :, :100].mean() > x[0, :, :100].mean()
    Image.fromarray(arr[:, :, 0]).save(tmp_path / "gray.png")  # grayscale -> 3 channels
    assert inputs.load_image(tmp_path / "gray.png").shape == (3, 224, 224)


def test_load_image_gray_gives_the_grayscale_copy_after_orientation(tmp_path):
    arr = np.zeros((40, 80, 3), np.uint8)
    arr[:, :40] = (255, 0, 0)  # red: luma 76
    arr[:, 40:] = (0, 0, 255)  # blue: luma 29
    exif = Image.Exif()
    exif[0x0112] = 3
    Image.fromarray(arr).save(tmp_path / "rot.jpg", exif=exif.tobytes(), quality=95)
    x = inputs.load_image(tmp_path / "rot.jpg", gray=True)
    assert x.shape == (3, 224, 224)
    assert np.allclose(x[0], x[1]) and np.allclose(x[1], x[2])  # one luma in all three channels
    # rotated first: the blue (darker) half is on the left
    assert x[0, :, :100].mean() < x[0, :, 124:].mean() - 0.2
    colour = inputs.load_image(tmp_path / "rot.jpg")
    assert not np.allclose(colour[0], colour[2])


def test_cache_images_gray_caches_the_grayscale_copies(tmp_path, monkeypatch):
    from crossprobe.models.data import features

    class Backbone:  # the channel spread of each image: 0 for a grayscale copy
        def run(self, _, feeds):
            px = feeds["pixels"]
            spread = (px.max(1) - px.min(1)).mean(axis=(1, 2))
            return [np.broadcast_to(spread[:, None, None], (len(px), 49, 1280)).copy()]

    monkeypatch.setattr(features, "image_backbone_session", lambda *_: Backbone())
    paths = []
    for i, c in enumerate([(200, 30, 30), (30, 200, 30), (30, 30, 200)]):
        Image.new("RGB", (32, 32), c).save(tmp_path / f"{i}.png")
        paths.append(tmp_path / f"{i}.png")
    grey = features.cache_images(paths, tmp_path / "gray.npy", batch=2, gray=True)
    colour = features.cache_images(paths, tmp_path / "colour.npy", batch=2)
    assert (np.asarray(grey) == 0).all() and (np.asarray(colour) > 0.5).all()
