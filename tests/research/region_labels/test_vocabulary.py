"""The region term's hypernym matching (research/region_labels/vocabulary.py) over the committed WordNet table."""
import torch

from crossprobe.models.bridge import class_lemmas
from research.region_labels.vocabulary import ancestors, rolled_up


def test_the_table_groups_breeds_under_dog_and_drops_abstract_ancestors():
    names, per_class = ancestors(130)
    golden = next(c for c, lem in enumerate(class_lemmas()) if lem[0] == "golden retriever")
    kept = {names[a] for a in per_class[golden]}
    assert {"dog", "retriever"} <= kept
    assert not kept & {"entity", "animal", "organism"}  # more than 130 classes below each
    assert "dog" not in {names[a] for a in per_class[next(c for c, l in enumerate(class_lemmas()) if l[0] == "tabby")]}
    shallow, _ = ancestors(10)
    assert "dog" not in shallow and "retriever" in shallow


def test_roll_up_is_the_max_over_a_class_and_its_kept_ancestors():
    sim = torch.tensor([[0.1] * 1000])
    per_class = [[] for _ in range(1000)]
    per_class[3] = [0, 1]
    per_class[4] = [1]
    out = rolled_up(sim, torch.tensor([[0.7, 0.4]]), per_class)
    assert torch.allclose(out[0, 3], torch.tensor(0.7)) and torch.allclose(out[0, 4], torch.tensor(0.4))
    assert torch.allclose(out[0, 5], torch.tensor(0.1))  # no ancestor: its own cosine (padding never wins)
    low = rolled_up(torch.tensor([[0.9] * 1000]), torch.tensor([[0.7, 0.4]]), per_class)
    assert torch.allclose(low, torch.tensor([[0.9] * 1000]))
