"""models/model_card.py: what the card says each reranker is, from the checkpoint's own record."""
import torch
from safetensors.torch import save_file

from crossprobe.models.model_card import reranker_lines


def test_reranker_lines_describe_a_merged_temde_and_a_single_cp(tmp_path):
    save_file({"cp.fusion.alpha": torch.tensor(20.0), "cp.fusion.beta": torch.tensor(8.0),
               "temde.fusion.alpha": torch.tensor(20.0), "temde.fusion.beta": torch.tensor(20.0)},
              str(tmp_path / "model.safetensors"))
    meta = {"model": {"cp": {"inputs": "backbone"}, "temde": {"inputs": "backbone", "N": 60}},
            "training": {"train_config": {"standalone_methods": ["cp", "temde"], "pretrain_by_method": {"cp": 5, "temde": 5},
                                          "epochs_by_method": {"cp": 6, "temde": 3}, "captions_by_method": {"temde": 5}},
                         "cp": {"best_epoch": 3},
                         "temde": {"best_epoch": [2, 3, 2], "members": [{}, {}, {}], "member_N": 20, "member_seeds": [0, 1, 2]}}}
    cp, temde = reranker_lines(tmp_path, meta)[:2]
    assert cp.startswith("- CP: reads the frozen backbone features") and "(kept: epoch 3, best on dev)" in cp
    assert "ranking logit = s_tt + 0.40 x s_cp." in cp
    assert temde.startswith("- T-EMDE (3 members of N=20, seeds 0, 1, 2, merged: the score is their mean): reads")
    assert "(kept per member: epochs 2, 3, 2, best on dev)" in temde and "5 captions of each training image" in temde
    assert "ranking logit = s_tt + 1.00 x s_temde." in temde
