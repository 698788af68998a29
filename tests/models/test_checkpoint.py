import json

import pytest
import torch

from crossprobe.models import checkpoint


def test_roundtrip_and_fingerprint(small_model, bert, tmp_path):
    fp = checkpoint.save(small_model, tmp_path / "ck", {"note": "test"})
    meta = json.loads((tmp_path / "ck" / "config.json").read_text())
    assert meta["fingerprint"] == fp and meta["note"] == "test"
    loaded, meta2 = checkpoint.load(tmp_path / "ck", bert)
    # stored in float16: equal to the original within half precision
    for k, v in small_model.trained_state_dict().items():
        assert torch.allclose(loaded.state_dict()[k], v, atol=1e-3, rtol=1e-3), k
    # the frozen MiniLM bottom is never stored
    from safetensors.torch import load_file

    assert not any(k.startswith("text.bottom.") for k in load_file(str(tmp_path / "ck" / "model.safetensors")))
    # saving again over it is atomic and gives the same fingerprint for the same weights
    assert checkpoint.save(loaded, tmp_path / "ck") == fp


def test_tampered_weights_are_refused(small_model, bert, tmp_path):
    checkpoint.save(small_model, tmp_path / "ck")
    cfgp = tmp_path / "ck" / "config.json"
    meta = json.loads(cfgp.read_text())
    meta["model"]["cp"]["layers"] = 2  # config no longer matches the weights' fingerprint
    cfgp.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="fingerprint"):
        checkpoint.load(tmp_path / "ck", bert)
