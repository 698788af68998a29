"""The reference tokenizers' training text and files (tests/support/reference_text.py): every script is present,
CLIP's vocabulary layout is the one open_clip and transformers index, and SentencePiece training is reproducible."""
import json
import unicodedata

import pytest

from tests.support import reference_text as rt


def test_corpus_covers_every_script():
    scripts = {"LATIN", "CYRILLIC", "CJK", "HIRAGANA", "HANGUL", "ARABIC", "DEVANAGARI"}
    seen = {unicodedata.name(ch).split()[0] for text in rt.corpus() for ch in text if ch.isalpha()}
    assert scripts <= seen
    sample = rt.sample_captions(16)
    assert len(sample) == len(set(sample)) == 16
    assert [rt.sample_captions(16, seed=3)] == [rt.sample_captions(16, seed=3)] != [sample]
    with pytest.raises(ValueError):
        rt.captions("xx")


def test_clip_vocab_layout(tmp_path):
    """Bytes, bytes + </w>, one token per merge, then <|startoftext|>, <|endoftext|>: the layout whose ids open_clip's
    SimpleTokenizer and a Hugging Face CLIP folder share (49,406 / 49,407 for the real vocabulary)."""
    merges = rt.train_clip_merges(rt.corpus(languages=("en",)), vocab_size=800)
    assert merges == rt.train_clip_merges(rt.corpus(languages=("en",)), vocab_size=800)  # reproducible
    vocab = rt.write_clip_bpe(tmp_path, merges)
    assert len(vocab) == 512 + len(merges) + 2
    assert vocab["a"] == 64 and vocab["a</w>"] == 256 + 64  # "!" (byte 33) comes first in the byte map
    assert vocab["<|endoftext|>"] == len(vocab) - 1
    assert json.loads((tmp_path / "vocab.json").read_text()) == vocab
    lines = (tmp_path / "merges.txt").read_text().splitlines()
    assert lines[0] == "#version: 0.2" and lines[1:] == [" ".join(m) for m in merges]
    assert "".join(merges[0]) in vocab and any(m[1].endswith("</w>") for m in merges)


@pytest.mark.parametrize("layout", ["siglip", "xlm_roberta"])
def test_sentencepiece_is_reproducible(tmp_path, layout):
    import sentencepiece as spm

    a = rt.train_sentencepiece(tmp_path / "a.model", rt.corpus(), vocab_size=8000, layout=layout)
    b = rt.train_sentencepiece(tmp_path / "b.model", rt.corpus(), vocab_size=8000, layout=layout)
    assert a.read_bytes() == b.read_bytes()
    sp = spm.SentencePieceProcessor(model_file=str(a))
    ids = {k: v for k, v in rt.SPM_LAYOUTS[layout].items() if v >= 0}
    assert {k: getattr(sp, k)() for k in ids} == ids
    assert sp.unk_id() not in sp.encode("一只狗在海滩上奔跑 कुत्ता पार्क में दौड़ रहा है")  # every character was seen
