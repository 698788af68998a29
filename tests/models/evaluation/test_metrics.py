import numpy as np
import pytest

from crossprobe.models.evaluation import metrics as M


def test_t2i_ranks_known_answers():
    # 3 captions x 3 images; gold images 0, 1, 2
    s = np.array([[0.9, 0.1, 0.2],   # gold first -> rank 0
                  [0.8, 0.5, 0.9],   # two above gold -> rank 2
                  [0.1, 0.3, 0.2]])  # one above -> rank 1
    assert M.t2i_ranks(s, np.array([0, 1, 2])).tolist() == [0, 2, 1]


def test_ties_count_against_the_gold_item():
    s = np.zeros((2, 4))  # a constant scorer
    assert M.t2i_ranks(s, np.array([0, 3])).tolist() == [3, 3]
    s = np.array([[0.5, 0.5, 0.1]])
    assert M.t2i_ranks(s, np.array([0])).tolist() == [1]


def test_i2t_uses_best_of_several_captions():
    # 4 captions (2 per image), 2 images
    cap_img = np.array([0, 0, 1, 1])
    s = np.array([[0.1, 0.9],   # caption 0 (image 0)
                  [0.8, 0.0],   # caption 1 (image 0): image 0's best caption
                  [0.2, 0.3],   # caption 2 (image 1)
                  [0.0, 0.95]]) # caption 3 (image 1)
    # image 0 ranks captions by column 0: [0.8 c1, 0.2 c2, 0.1 c0, 0.0 c3] -> best own = c1 at rank 0
    # image 1 ranks by column 1: [0.95 c3, 0.9 c0, 0.3 c2, 0.0 c1] -> c3 at rank 0
    assert M.i2t_ranks(s, cap_img).tolist() == [0, 0]
    s[3, 1] = 0.0  # now image 1's captions: c2 at 0.3 behind c0 (0.9) -> rank 1
    assert M.i2t_ranks(s, cap_img).tolist() == [0, 1]


def test_summarize():
    r = M.summarize(np.array([0, 1, 4, 9, 20]))
    assert r["R@1"] == pytest.approx(20.0)
    assert r["R@5"] == pytest.approx(60.0)
    assert r["R@10"] == pytest.approx(80.0)
    assert r["medr"] == 5.0
    assert r["MRR"] == pytest.approx(np.mean([1, 1 / 2, 1 / 5, 1 / 10, 1 / 21]))


def test_topk_and_rerank_keep_order_below_k():
    s = np.array([[0.1, 0.9, 0.5, 0.7, 0.3]])
    cand = M.topk(s, 3)
    assert cand.tolist() == [[1, 3, 2]]
    # reranker prefers item 2 most; items 0 and 4 stay below in first-stage order (4 above 0)
    out = M.apply_rerank(s, cand, np.array([[0.0, 1.0, 5.0]]))
    assert np.argsort(-out[0], kind="stable").tolist() == [2, 3, 1, 4, 0]
    # gold outside the shortlist cannot be lifted: its rank is k + its order below
    assert M.t2i_ranks(out, np.array([0])).tolist() == [4]


def test_rsum():
    a = {"R@1": 1, "R@5": 2, "R@10": 3}
    assert M.rsum(a, a) == 12
