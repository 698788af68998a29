"""core/graph_files.py: the int8 query tower of a graphs folder that cannot be written."""
from __future__ import annotations

import errno

import pytest

from crossprobe.core import graph_files, int8


def test_a_read_only_folder_without_this_hosts_int8_format_says_what_to_export(tmp_path, monkeypatch):
    (tmp_path / "query_tower.onnx").write_bytes(b"")

    def read_only(src, dst, weights):
        raise PermissionError(errno.EACCES, "Permission denied", str(dst))

    monkeypatch.setattr(graph_files, "quantize_query_tower", read_only)
    with pytest.raises(graph_files.GraphsUnavailable, match=r"crossprobe export --int8 u8") as e:
        graph_files.ensure_int8_query(tmp_path, "u8")
    assert int8.kernel_path() in str(e.value) and "Permission denied" in str(e.value)


def test_an_int8_graph_already_there_is_used_as_it_is(tmp_path, monkeypatch):
    (tmp_path / "query_tower.onnx").write_bytes(b"")
    (tmp_path / "query_tower.int8.onnx").write_bytes(b"x")
    monkeypatch.setattr(graph_files, "quantize_query_tower", lambda *a, **k: pytest.fail("quantized again"))
    assert graph_files.ensure_int8_query(tmp_path, "s8") == tmp_path / "query_tower.int8.onnx"
