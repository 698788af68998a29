"""Multilingual queries reach the model untouched (issue 47, deliver 5): nothing on the way (crossprobe's text cleaning,
the tokenizer settings an export writes) folds or drops non-Latin scripts. Here in the main .venv: the cleaning, and
M-CLIP's XLM-R tokenizer through the export's own check and the serving code; the M-CLIP towers' embeddings against
multilingual_clip's own forward need open_clip (test_open_clip.py, make test-openclip)."""
from __future__ import annotations

import re

import pytest

from crossprobe.models.families import mclip, writer
from crossprobe.models.families.base import FamilyModel
from crossprobe.models.families.text import PROBE
from crossprobe.core.inference.exported import clean_text, text_tokenizer, tokenize
from tests.support import reference_text as rt

SCRIPTS = {"zh": "一只狗在海滩上奔跑", "ar": "الكلب يجري على الشاطئ", "hi": "कुत्ता समुद्र तट पर दौड़ रहा है",
           "ru": "Собака бежит по пляжу", "ja": "犬が海辺で走っている", "ko": "개가 해변에서 달리고 있다"}
CAPTIONS = [c for lang in ("zh", "ar", "hi", "ru", "ja", "ko") for c in rt.captions(lang)[:8]]


@pytest.mark.parametrize("how", ["none", "whitespace", "open_clip", "canonicalize"])
def test_cleaning_never_touches_other_scripts(how):
    """Every cleaning keeps every letter and mark of these scripts (Devanagari's vowel signs and viramas, Arabic's
    joiners included); canonicalize removes ASCII punctuation only, as SigLIP / open_clip / Immich do."""
    for text in [*SCRIPTS.values(), *CAPTIONS]:
        out = clean_text(f"  {text}  ", how)
        want = f"  {text}  " if how == "none" else re.sub(r"\s+", " ", text).strip()
        assert out == (want.lower() if how == "canonicalize" else want)
    assert clean_text("一只狗，在海滩上！", "canonicalize") == "一只狗，在海滩上！"  # full-width punctuation is text


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory):
    """M-CLIP's tokenizer: an XLM-R SentencePiece model (XLM-R's special-token layout) trained on captions in eight
    languages, loaded as transformers loads M-CLIP's text folder."""
    from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaTokenizer

    dst = tmp_path_factory.mktemp("xlmr")
    spm = rt.train_sentencepiece(dst / "sentencepiece.bpe.model", rt.corpus(), vocab_size=8000, layout="xlm_roberta")
    XLMRobertaTokenizer.from_pretrained(spm.parent).save_pretrained(dst)
    return AutoTokenizer.from_pretrained(dst), XLMRobertaConfig(max_position_embeddings=514)


def test_mclip_tokenizer_gives_xlmr_ids_for_every_script(xlmr):
    """The tokenizer.json and "text" settings an M-CLIP export writes give XLM-R's own ids, through the serving
    code (exported.tokenize), on the probe texts and captions in six non-Latin scripts; and none of those captions
    lose a character to <unk> (each script was in the tokenizer's training text)."""
    tok, base = xlmr
    cfg, tokenizer_json, reference_ids = mclip._text_settings(tok, base)
    assert cfg["clean"] == "none" and not cfg["lowercase"] and not cfg["pad_to_context"]
    m = FamilyModel("mclip", "hf:test", "test", {}, {}, {}, None, None, {}, cfg, tokenizer_json, reference_ids)
    assert "ids equal" in writer.check_tokenizer(m, PROBE + CAPTIONS)
    ids, mask = tokenize(text_tokenizer(tokenizer_json, cfg), cfg, CAPTIONS)
    assert tok.unk_token_id not in ids[mask == 1]
    for row, caption in zip(ids, CAPTIONS):
        assert tok.decode(row, skip_special_tokens=True) == caption  # every character reaches the model
