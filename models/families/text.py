"""The texts an export checks its tokenizer on, and the `tokenizers` pipelines built for families whose own
tokenizer is not a `tokenizers` file (open_clip's CLIP BPE; SentencePiece models).

An export is refused unless tokenizer.json (with model.json's "text" settings, through exported.tokenize, the code
that serves it) gives the family tokenizer's own ids for every PROBE text, id for id."""

from __future__ import annotations

# Captions as people type them: case, punctuation, spacing, apostrophes, HTML entities, digits, long ones (past
# every context length), and other scripts, which must reach the model untouched (issue 47).
PROBE = [
    "a dog runs on the beach",
    "A Dog, runs!  on the BEACH.",
    "  two children\tplaying\nin the snow  ",
    "it's a dog's life, isn't it?",
    "fish &amp; chips on a plate",
    "3 cats and 12 birds in 2024",
    "a man in a red-and-white shirt (left) jumps",
    "Ünïcödé café résumé naïve façade",
    "ÀÉÎÕÜ ÇÑ ß",
    "\u201ccurly quotes\u201d and \u2018single ones\u2019",
    "the \ufb01sh and the \ufb02ower",
    "ＦＵＬＬ ｗｉｄｔｈ　ｔｅｘｔ！",
    "emoji 🐶🌊 at the sea 🏖️",
    "a " + "very " * 80 + "long caption",
    "一只狗在海滩上奔跑",
    "两个孩子在公园里玩耍，天气很好。",
    "一只猫坐在窗台上？",
    "犬が海辺で走っている",
    "ﾊﾝｶｸ カタカナ と ひらがな、漢字。",
    "女の子が公園で遊んでいる！",
    "개가 해변에서 달리고 있다",
    "고양이가 잔디 위에 앉아 있다",
    "Собака бежит по пляжу.",
    "ДВА МАЛЬЧИКА играют в футбол",
    "Ёлка и ёж",
    "الكلب يجري على الشاطئ",
    "فتاة تلعب في الحديقة، والشمس مشرقة.",
    "رجل يركب دراجة",
    "कुत्ता समुद्र तट पर दौड़ रहा है",
    "लड़की पार्क में खेल रही है।",
    "बर्फ़ में एक आदमी",
    "Ο σκύλος τρέχει στην παραλία",
    "ΣΊΣΥΦΟΣ και η πέτρα",
    "הכלב רץ על החוף",
    "สุนัขวิ่งบนชายหาด",
    "Köpek sahilde koşuyor İstanbul",
    "Pies biegnie po plaży, źdźbło",
    "Con chó đang chạy trên bãi biển",
    "un niño salta en la nieve ¿verdad?",
    "Ein Hund läuft am Strand",
    "une femme marche près du lac",
    "Der Fluß, die Straße",
    "mixed 中文 and English text",
    "مرحبا hello привет नमस्ते 你好",
    "a photo of a dog.",
    "A PHOTO OF A CAT",
    "dog",
    "",
    "   ",
    "!!!",
    "123",
    "e-mail: someone@example.com",
    "path/to/file_name.jpg",
    "#hashtag @mention",
    "tab\tseparated\tvalues",
    "line\r\nbreaks\u2028here",
    "non\u00a0breaking space",
    "zero\u200bwidth",
    "combining e\u0301 accents",
    "ﬀ ﬃ ligatures",
]


def clip_bpe_tokenizer(
    vocab: dict[str, int], merges: list[tuple[str, str]], replacements: dict[str, str], special: tuple[str, str]
):
    """CLIP's byte-level BPE (open_clip's SimpleTokenizer: its vocabulary and merges) as a `tokenizers` Tokenizer:
    `replacements` (single characters the family's cleaning replaces first: open_clip's ftfy), NFC, CLIP's word split,
    byte-level characters, BPE with `</w>` on word ends, special = (start, end) around."""
    import re

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, end_of_word_suffix="</w>", fuse_unk=False))
    replaced = [normalizers.Replace(a, b) for a, b in sorted(replacements.items())]
    tok.normalizer = normalizers.Sequence(replaced + [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " ")])
    bos, eos = special
    split = "|".join(map(re.escape, special)) + r"|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, vocab[bos]), (eos, vocab[eos])]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def with_eos(tok, eos: str, eos_id: int):
    """A tokenizer whose every text ends with `eos` (SigLIP's SentencePiece: ids + [</s>])."""
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, eos_id)])
    return tok


def fast_tokenizer_settings(tok, T: int):
    """A transformers fast tokenizer (`tok`) as an export writes it: (model.json's "text" settings, tokenizer.json
    without truncation or padding (exported.tokenize does both), the reference ids of a text: tok's own, truncated
    at the context length T)."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    cfg = {
        "context_length": T,
        "pad_id": int(tok.pad_token_id),
        "pad_token": tok.pad_token,
        "pad_to_context": False,
        "clean": "none",
        "lowercase": False,
        "inputs": ["input_ids", "attention_mask"],
    }
    return cfg, backend.to_str(), lambda t: tok(t, truncation=True, max_length=T)["input_ids"]
