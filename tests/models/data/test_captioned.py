"""The captioned-folder layout (models/data/captioned.py): splits, several captions per image, bad lines counted."""
from __future__ import annotations

import pytest
from PIL import Image

from crossprobe.models.data.captioned import CaptionedFolder, read_captions, write_captions


def _images(root, names):
    (root / "images").mkdir(parents=True, exist_ok=True)
    for n in names:
        (root / "images" / n).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (len(n) * 20 % 255, 0, 0)).save(root / "images" / n)


def test_a_folder_without_the_split_column_is_all_train(tmp_path):
    _images(tmp_path, ["a.png", "b.png"])
    (tmp_path / "captions.tsv").write_text("image\tcaption\nb.png\ta boat\na.png\tan apple\na.png\ta red apple\n")
    f = CaptionedFolder.load(tmp_path)
    assert f.images == ["a.png", "b.png"] and f.caption_image == [1, 0, 0]
    assert f.image_split == ["train", "train"] and f.split_counts() == {"train": 3} and f.bad_lines == []
    assert f.rows("train") == ([0, 1], [0, 1, 2]) and f.rows("test") == ([], [])


def test_splits_select_images_with_all_their_captions(tmp_path):
    _images(tmp_path, ["a.png", "b.png", "sub/c.png"])
    (tmp_path / "captions.tsv").write_text(
        "image\tcaption\tsplit\tsource\n"
        "a.png\tan apple\ttrain\tx\n"
        "b.png\ta boat\ttest\n"
        "sub/c.png\ta cat\tdev\n"
        "a.png\tanother apple\t\n"  # empty cell: train
        "b.png\tthe boat again\ttest\n")
    f = CaptionedFolder.load(tmp_path)
    assert f.images == ["a.png", "b.png", "sub/c.png"]
    assert f.rows("test") == ([1], [1, 4]) and f.rows("dev") == ([2], [2]) and f.rows("train") == ([0], [0, 3])
    assert f.rows("all") == ([0, 1, 2], [0, 1, 2, 3, 4])
    assert f.split_counts() == {"train": 2, "test": 2, "dev": 1}
    assert f.image_path(2) == tmp_path / "images" / "sub" / "c.png"
    with pytest.raises(ValueError, match="split 'val'"):
        f.rows("val")


def test_bad_lines_are_counted_with_their_reason_never_dropped_silently(tmp_path, caplog):
    _images(tmp_path, ["a.png", "b.png"])
    (tmp_path / "captions.tsv").write_text(
        "image\tcaption\tsplit\n"
        "a.png\tan apple\ttrain\n"
        "a.png only one field\n"  # line 3
        "b.png\t   \ttrain\n"  # line 4: empty caption
        "b.png\ta boat\tval\n"  # line 5: unknown split
        "../etc/passwd\troot\ttrain\n"  # line 6: outside images/
        "\n"  # a blank line holds nothing
        "a.png\tthe apple again\ttest\n"  # line 8: a.png is train on line 2
        "b.png\ta boat\ttest\n")
    with caplog.at_level("WARNING"):
        f = CaptionedFolder.load(tmp_path)
    assert [(b.line, b.reason) for b in f.bad_lines] == [
        (3, "fewer than 2 fields"), (4, "empty caption"), (5, "unknown split"), (6, "image name outside images/"),
        (8, "split differs from the image's line 2")]
    assert f.bad_summary()["unknown split"] == 1 and len(f.captions) == 2
    assert "5 lines not used" in caplog.text


def test_missing_images_and_a_wrong_header_are_errors(tmp_path):
    _images(tmp_path, ["a.png"])
    (tmp_path / "captions.tsv").write_text("image\tcaption\na.png\tx\nzz.png\ty\n")
    with pytest.raises(FileNotFoundError, match="1 captioned images missing"):
        CaptionedFolder.load(tmp_path)
    (tmp_path / "captions.tsv").write_text("file\ttext\na.png\tx\n")
    with pytest.raises(ValueError, match="header"):
        CaptionedFolder.load(tmp_path)


def test_written_captions_read_back_and_replace_the_file_whole(tmp_path):
    path = tmp_path / "captions.tsv"
    path.write_text("old")
    write_captions(path, [("a.png", "a dog\tin the\nsnow", "train"), ("b.png", "ein Hund, 一只狗", "test")])
    rows, bad = read_captions(path)
    assert rows == [("a.png", "a dog in the snow", "train"), ("b.png", "ein Hund, 一只狗", "test")] and bad == []
    assert [p.name for p in tmp_path.iterdir()] == ["captions.tsv"]  # no temp file left behind
