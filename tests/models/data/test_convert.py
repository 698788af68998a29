"""`crossprobe data convert` (models/data/convert.py) on small generated COCO and Karpathy-split files."""
from __future__ import annotations

import json
import os

from PIL import Image
from typer.testing import CliRunner

from crossprobe.cli import app
from crossprobe.models.data.captioned import CaptionedFolder
from crossprobe.models.data.convert import from_coco, from_karpathy


def _png(path, shade):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 10), (shade, 255 - shade, 40)).save(path)


def _coco(tmp_path, split_name="train2017", ids=(1, 2, 3)):
    imgs = tmp_path / "coco" / split_name
    for i in ids:
        _png(imgs / f"{i:012d}.jpg", 30 * i)
    d = {"images": [{"id": i, "file_name": f"{i:012d}.jpg", "width": 12} for i in ids]
         + [{"id": 99, "file_name": "000000000099.jpg"}, {"file_name": "no-id.jpg"}, {"id": 7, "file_name": "../x.jpg"}],
         "annotations": [{"image_id": ids[0], "id": 10, "caption": "A dog\tin the\nsnow. "},
                         {"image_id": ids[0], "id": 11, "caption": "a white dog"},
                         {"image_id": ids[1], "id": 12, "caption": "两只猫"},
                         {"image_id": ids[-1], "id": 13, "caption": "   "},
                         {"image_id": 555, "id": 14, "caption": "an orphan"},
                         {"image_id": 99, "id": 15, "caption": "its file is missing"}]}
    path = tmp_path / f"captions_{split_name}.json"
    path.write_text(json.dumps(d))
    return path, imgs


def test_coco_captions_become_a_folder_with_counted_skips(tmp_path):
    captions, imgs = _coco(tmp_path)
    out = tmp_path / "folder"
    r = from_coco(captions, imgs, out, split="train")
    assert r.captions == {"train": 3} and r.images == 2
    assert r.bad == {"image entry without an id or a plain file name": 2, "empty caption": 1,
                     "caption of an unknown image id": 1, "image file missing": 1, "caption of an image not placed": 1}
    assert "../x.jpg" in r.examples["image entry without an id or a plain file name"][1]
    f = CaptionedFolder.load(out)
    assert f.images == ["000000000001.jpg", "000000000002.jpg"]
    assert f.captions == ["A dog in the snow.", "a white dog", "两只猫"] and f.caption_image == [0, 0, 1]
    assert (out / "images" / "000000000001.jpg").is_symlink()  # linked by default
    assert os.path.samefile(out / "images" / "000000000001.jpg", imgs / "000000000001.jpg")
    assert "1 x image file missing" in r.summary()


def test_a_second_coco_file_adds_its_split_and_a_rerun_adds_nothing(tmp_path):
    train, timgs = _coco(tmp_path, "train2017", (1, 2))
    val, vimgs = _coco(tmp_path, "val2017", (4, 5, 6))
    out = tmp_path / "folder"
    from_coco(train, timgs, out, split="train")
    r = from_coco(val, vimgs, out, split="dev", link=False)
    assert r.kept == 3 and r.captions == {"dev": 3}
    assert not (out / "images" / "000000000004.jpg").is_symlink()  # --copy
    again = from_coco(val, vimgs, out, split="dev", link=False)
    assert again.already == 3 and sum(again.captions.values()) == 0 and again.images == 0
    clash = from_coco(val, vimgs, out, split="test")
    assert clash.bad["image already in the folder under another split"] == 3
    f = CaptionedFolder.load(out)
    assert f.split_counts() == {"train": 3, "dev": 3} and len(f.images) == 4


def _karpathy(tmp_path, flat=False):
    root = tmp_path / "k"
    entries = []
    for i, (split, folder) in enumerate([("train", "train2014"), ("restval", "val2014"), ("val", "val2014"),
                                         ("test", "val2014"), ("extra", "val2014")]):
        name = f"COCO_{folder}_{i:012d}.jpg"
        _png(root / ("" if flat else folder) / name, 50 * i)
        entries.append({"filepath": folder, "filename": name, "split": split, "imgid": i,
                        "sentences": [{"raw": f"picture {i} one", "tokens": []}, {"raw": f"picture {i} two"}]})
    entries[0]["sentences"].append({"tokens": ["no", "raw"]})
    entries.append({"filepath": "val2014", "filename": "gone.jpg", "split": "test", "sentences": [{"raw": "lost"}]})
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps({"images": entries, "dataset": "coco"}))
    return path, root


def test_karpathy_splits_map_to_train_dev_test(tmp_path):
    path, root = _karpathy(tmp_path)
    r = from_karpathy(path, root, tmp_path / "out")
    assert r.captions == {"train": 4, "dev": 2, "test": 2}
    assert r.bad == {"empty caption": 1, "unknown split": 2, "image file missing": 1, "caption of an image not placed": 1}
    f = CaptionedFolder.load(tmp_path / "out")
    split = dict(zip(f.images, f.image_split))
    assert split["COCO_train2014_000000000000.jpg"] == "train" and split["COCO_val2014_000000000001.jpg"] == "train"
    assert split["COCO_val2014_000000000002.jpg"] == "dev" and split["COCO_val2014_000000000003.jpg"] == "test"


def test_karpathy_images_kept_in_one_folder_are_found(tmp_path):
    path, root = _karpathy(tmp_path, flat=True)  # no train2014/ val2014/ below the images folder
    r = from_karpathy(path, root, tmp_path / "out")
    assert r.images == 4 and sum(r.captions.values()) == 8


def test_the_command_reports_and_refuses_bad_files(tmp_path):
    path, root = _karpathy(tmp_path)
    runner = CliRunner()
    res = runner.invoke(app, ["data", "convert", "karpathy", str(path), "--images", str(root), "--out",
                              str(tmp_path / "out"), "--copy"])
    assert res.exit_code == 0, res.output
    assert "8 captions added" in res.output and "2 x unknown split" in res.output
    assert not (tmp_path / "out" / "images" / "COCO_train2014_000000000000.jpg").is_symlink()
    (tmp_path / "broken.json").write_text("{not json")
    res = runner.invoke(app, ["data", "convert", "coco", str(tmp_path / "broken.json"), "--images", str(root),
                              "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and "not a readable JSON file" in res.output
    res = runner.invoke(app, ["data", "convert", "coco", str(path), "--images", str(root), "--out",
                              str(tmp_path / "o3"), "--split", "val"])
    assert res.exit_code == 2
