"""research/temde/sweep.py: its variants mean the same recipe whatever TrainConfig's defaults are."""
from crossprobe.models.training.run import TrainConfig, reranker_config

from research.temde import sweep as temde_sweep


def test_variants_are_pinned_to_the_recipe_they_were_measured_on():
    served = reranker_config(TrainConfig(), "temde")
    assert served.captions_per_image == 5  # the adopted variant (captions5) is the default now
    assert reranker_config(TrainConfig(), "cp").captions_per_image == 1
    # a row's recipe is BEFORE + its changes, not the current default + its changes
    for name, (_, changes) in temde_sweep.VARIANTS.items():
        recipe = {**temde_sweep.BEFORE, **changes}
        assert recipe["captions_per_image"] == (5 if name == "captions5" or name.startswith("c5_") else 1), name
