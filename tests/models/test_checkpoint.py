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


COMMITTED = sorted(p.parent.name for p in checkpoint.DEFAULT_CHECKPOINT.parent.glob("*/model.safetensors")
                   if "model" in json.loads((p.parent / "config.json").read_text()))  # not the text gate


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_checkpoints_load_and_keep_their_saved_config(name, bert):
    """ACE-RPE's fields are nested in code (AceRpeConfig) but saved flat, as every checkpoint has them: a committed
    checkpoint loads (its fingerprint checked), and its joint rerankers' configs save back to the bytes it holds."""
    from crossprobe.models.research.ace_rpe import AceRpeConfig
    from crossprobe.models.model import ModelConfig

    path = checkpoint.DEFAULT_CHECKPOINT.parent / name
    model, meta = checkpoint.load(path, bert)
    saved = ModelConfig.from_dict(meta["model"]).to_dict()
    for joint in ("sm", "tv"):
        assert json.dumps(saved[joint]) == json.dumps(meta["model"][joint])
        assert set(AceRpeConfig.FLAT.values()) <= set(saved[joint])
    assert isinstance(model.cfg.tv.ace, AceRpeConfig) and model.cfg.tv.ace.enabled is False
    if name == "default":  # today's defaults are the served model's: the whole config saves back unchanged
        assert json.dumps(saved) == json.dumps(meta["model"])
        assert checkpoint.fingerprint(checkpoint.stored(model.trained_state_dict()), saved) == meta["fingerprint"]


def test_what_export_loads_leaves_the_research_references_out(bert):
    """checkpoint.load(references=False), as `crossprobe export` and the torch backends load: no SM / TV modules
    and no graphs of theirs to export, the served weights the same as a full load's, the fingerprint still checked
    over every stored tensor."""
    from crossprobe.models import graphs

    full, meta = checkpoint.load(None, bert)
    served, meta2 = checkpoint.load(None, bert, references=False)
    assert meta2["fingerprint"] == meta["fingerprint"]
    assert hasattr(full, "sm") and hasattr(full, "tv")
    assert not hasattr(served, "sm") and not hasattr(served, "tv")
    want = {k: v for k, v in full.state_dict().items() if not k.startswith(checkpoint.REFERENCE_PREFIXES)}
    got = served.state_dict()
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert "sm_scorer" in graphs.available(full) and "tv_scorer" in graphs.available(full)
    assert set(graphs.available(served)) == set(graphs.GRAPHS) - set(graphs.REFERENCE_GRAPHS)
