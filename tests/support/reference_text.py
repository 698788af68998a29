"""Captions and tokenizers for the random-weight reference models (issue 47).

No real tokenizer of SigLIP or XLM-RoBERTa ships in any package here, so the references get tokenizers trained on
text made here: templated captions in eight languages (Latin, Cyrillic, Arabic, Devanagari, Han, Kana and Hangul
scripts), optionally joined by a caption file a caller has (Flickr8k's captions.tsv for the parity benchmark). Every
function is deterministic: the same inputs give byte-identical tokenizer files.

- `corpus()`: the training text; `sample_captions(n)`: a mixed-language list for parity checks.
- `write_clip_bpe()`: CLIP's byte-level BPE as vocab.json + merges.txt (the files of a Hugging Face CLIP folder), either
  converted from the vocabulary open_clip ships (the real one) or trained with `tokenizers` in the same layout.
- `train_sentencepiece()`: a SentencePiece unigram model with SigLIP's (T5) or XLM-R's special-token layout.
"""
from __future__ import annotations

import csv
import gzip
import heapq
import itertools
import json
import random
from collections import Counter, defaultdict
from pathlib import Path

# (subjects, actions, places, sentence) per language; subjects carry their grammatical gender where the verb agrees
# with it (Arabic, Hindi). Written for tokenizer training and parity captions, not as translations to be judged.
_EN = (["a dog", "a cat", "a boy", "a girl", "a man", "a woman", "a horse", "a bird"],
       ["runs", "jumps", "sits", "plays", "sleeps", "walks"],
       ["on the beach", "in the park", "by the lake", "in the street", "on the grass", "in the snow"])
_EN_COLOURS = ["black", "white", "brown", "small", "young", "happy"]
_ES = (["un perro", "un gato", "un niño", "una niña", "un hombre", "una mujer", "un caballo", "un pájaro"],
       ["corre", "salta", "juega", "duerme", "camina", "nada"],
       ["en la playa", "en el parque", "junto al lago", "en la calle", "sobre la hierba", "en la nieve"])
_RU = (["собака", "кошка", "мальчик", "девочка", "мужчина", "женщина", "лошадь", "птица"],
       ["бежит", "прыгает", "сидит", "играет", "спит", "гуляет"],
       ["на пляже", "в парке", "у озера", "на улице", "на траве", "в снегу"])
_ZH = (["一只狗", "一只猫", "一个男孩", "一个女孩", "一个男人", "一个女人", "一匹马", "一只鸟"],
       ["奔跑", "跳跃", "坐着", "玩耍", "睡觉", "散步"],
       ["海滩上", "公园里", "湖边", "街上", "草地上", "雪地里"])
_JA = (["犬", "猫", "男の子", "女の子", "男性", "女性", "馬", "鳥"],
       ["走っている", "跳んでいる", "座っている", "遊んでいる", "寝ている", "歩いている"],
       ["海辺", "公園", "湖のそば", "通り", "草の上", "雪の中"])
_KO = (["개가", "고양이가", "소년이", "소녀가", "남자가", "여자가", "말이", "새가"],
       ["달리고 있다", "뛰고 있다", "앉아 있다", "놀고 있다", "자고 있다", "걷고 있다"],
       ["해변", "공원", "호수 옆", "거리", "잔디 위", "눈 속"])
_AR = ([("الكلب", "m"), ("القطة", "f"), ("الولد", "m"), ("الفتاة", "f"), ("الرجل", "m"), ("المرأة", "f"),
        ("الحصان", "m"), ("الطائر", "m")],
       [("يجري", "تجري"), ("يقفز", "تقفز"), ("يجلس", "تجلس"), ("يلعب", "تلعب"), ("ينام", "تنام"), ("يمشي", "تمشي")],
       ["على الشاطئ", "في الحديقة", "بجانب البحيرة", "في الشارع", "على العشب", "في الثلج"])
_HI = ([("कुत्ता", "m"), ("बिल्ली", "f"), ("लड़का", "m"), ("लड़की", "f"), ("आदमी", "m"), ("औरत", "f"),
        ("घोड़ा", "m"), ("चिड़िया", "f")],
       ["दौड़", "कूद", "खेल", "सो", "तैर", "चल"],
       ["समुद्र तट पर", "पार्क में", "झील के पास", "सड़क पर", "घास पर", "बर्फ में"])

LANGUAGES = ("en", "es", "ru", "zh", "ja", "ko", "ar", "hi")


def captions(language: str) -> list[str]:
    """Every templated caption of one language (288 each; English 576 with its colour variants)."""
    if language == "en":
        subjects, actions, places = _EN
        plain = [f"{s} {a} {p}" for s, a, p in itertools.product(subjects, actions, places)]
        coloured = [f"{s.split()[0]} {c} {s.split()[1]} {a} {p}"
                    for s, c, a, p in itertools.product(subjects, _EN_COLOURS, actions[:2], places[:4])]
        return plain + coloured
    if language in ("es", "ru"):
        subjects, actions, places = _ES if language == "es" else _RU
        return [f"{s} {a} {p}" for s, a, p in itertools.product(subjects, actions, places)]
    if language == "zh":
        return [f"{s}在{p}{a}" for s, a, p in itertools.product(*_ZH)]
    if language == "ja":
        return [f"{s}が{p}で{a}" for s, a, p in itertools.product(*_JA)]
    if language == "ko":
        return [f"{s} {p}에서 {a}" for s, a, p in itertools.product(*_KO)]
    if language == "ar":
        return [f"{s} {a[0] if g == 'm' else a[1]} {p}" for (s, g), a, p in itertools.product(*_AR)]
    if language == "hi":
        return [f"{s} {p} {a} {'रहा' if g == 'm' else 'रही'} है" for (s, g), a, p in itertools.product(*_HI)]
    raise ValueError(f"no captions for language {language!r}; have {LANGUAGES}")


def caption_file_lines(path: Path, limit: int | None = None) -> list[str]:
    """Captions from a tab-separated file with a `caption` column (Flickr8k's captions.tsv), in file order."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f, delimiter="\t")
        return [r["caption"].strip() for r in itertools.islice(rows, limit)]


def corpus(languages: tuple[str, ...] = LANGUAGES, extra: list[str] | None = None) -> list[str]:
    """The training text: every templated caption of `languages`, then `extra` (a caller's own captions)."""
    return [c for lang in languages for c in captions(lang)] + list(extra or [])


def sample_captions(n: int, seed: int = 0, languages: tuple[str, ...] = LANGUAGES) -> list[str]:
    """n captions drawn round-robin over `languages` (so every script is in even a short list), fixed by seed."""
    rng = random.Random(seed)
    pools = {lang: rng.sample(captions(lang), len(captions(lang))) for lang in languages}
    return [pools[languages[i % len(languages)]][i // len(languages)] for i in range(n)]


# ---------------------------------------------------------------- CLIP's byte-level BPE (vocab.json + merges.txt)

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / CLIP's reversible map from bytes to printable characters (the BPE's base alphabet, in its order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars)))


def _clip_vocab(merges: list[tuple[str, str]]) -> dict[str, int]:
    """CLIP's id layout (open_clip's SimpleTokenizer and HF's vocab.json alike): the 256 byte characters, the same
    with the end-of-word mark, one token per merge in merge order, then <|startoftext|> and <|endoftext|>."""
    base = list(_bytes_to_unicode().values())
    tokens = base + [b + "</w>" for b in base] + ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(tokens)}


def openclip_bpe_merges() -> list[tuple[str, str]]:
    """The merges of the BPE vocabulary open_clip ships (bpe_simple_vocab_16e6.txt.gz), cut where its
    SimpleTokenizer cuts them (49,152 - 256 - 2 merges, so 49,408 ids in all)."""
    import open_clip.tokenizer as oct  # the export venv only

    with gzip.open(oct.default_bpe(), "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    return [tuple(m.split()) for m in lines[1:49152 - 256 - 2 + 1]]


# CLIP's word split (open_clip's SimpleTokenizer and transformers' CLIPTokenizer use this same pattern)
_CLIP_SPLIT = r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"


def clip_words(texts: list[str]) -> Counter:
    """Word counts under CLIP's pre-tokenization as transformers' CLIPTokenizer does it (NFC, whitespace collapsed,
    lower-case, CLIP's split, byte-level characters), each word as its BPE start: characters, `</w>` on the last."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    norm = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()])
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(_CLIP_SPLIT), behavior="removed", invert=True),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False)])
    words = Counter(w for t in texts for w, _ in pre.pre_tokenize_str(norm.normalize_str(t)))
    return Counter({tuple(w[:-1]) + (w[-1] + "</w>",): n for w, n in words.items()})


def train_clip_merges(texts: list[str], vocab_size: int, min_count: int = 2) -> list[tuple[str, str]]:
    """BPE merges for a CLIP vocabulary of at most `vocab_size` ids, learnt on `texts` (for a CLIP folder where
    open_clip's real vocabulary is not installed). A plain BPE learner rather than `tokenizers`' BpeTrainer: that one
    breaks ties between equally frequent pairs differently from run to run, and a reference must rebuild
    byte-identically; here ties go to the smallest pair."""
    counted = sorted(clip_words(texts).items())
    words, freq = [list(w) for w, _ in counted], [n for _, n in counted]
    pairs, where = Counter(), defaultdict(set)
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pairs[p] += freq[i]
            where[p].add(i)
    heap = [(-n, p) for p, n in pairs.items()]
    heapq.heapify(heap)
    merges = []
    while heap and len(merges) < vocab_size - 512 - 2:
        n, best = heapq.heappop(heap)
        if -n != pairs.get(best, 0):
            continue  # a stale entry: the pair's count changed since it was pushed
        if -n < min_count:
            break
        merges.append(best)
        changed = set()
        for i in sorted(where.pop(best)):
            changed |= _merge_word(words, freq, i, best, pairs, where)
        pairs.pop(best, None)
        for p in sorted(changed - {best}):
            if pairs[p] > 0:
                heapq.heappush(heap, (-pairs[p], p))
    return merges


def _merge_word(words, freq, i, pair, pairs, where) -> set:
    """Apply one merge to word i, keeping the pair counts and the pair -> words index current; returns the pairs
    whose counts changed."""
    old = words[i]
    new, j = [], 0
    while j < len(old):
        if j + 1 < len(old) and (old[j], old[j + 1]) == pair:
            new.append(old[j] + old[j + 1])
            j += 2
        else:
            new.append(old[j])
            j += 1
    for p in zip(old, old[1:]):
        pairs[p] -= freq[i]
    for p in zip(new, new[1:]):
        pairs[p] += freq[i]
        where[p].add(i)
    words[i] = new
    return set(zip(old, old[1:])) | set(zip(new, new[1:]))


def write_clip_bpe(dst: Path, merges: list[tuple[str, str]]) -> dict[str, int]:
    """Write vocab.json + merges.txt (the tokenizer files of a Hugging Face CLIP folder) for `merges`; returns the
    vocabulary (its size is the text tower's vocab_size)."""
    dst.mkdir(parents=True, exist_ok=True)
    vocab = _clip_vocab(merges)
    (dst / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (dst / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    return vocab


# ---------------------------------------------------------------- SentencePiece (SigLIP's T5 layout, XLM-R's layout)

# special-token ids as the real models have them: SigLIP's spiece.model (T5's) has <pad>=0, </s>=1, <unk>=2 and no
# <s>; XLM-R's sentencepiece.bpe.model has <unk>=0, <s>=1, </s>=2 (transformers then shifts ids by one for <pad>)
SPM_LAYOUTS = {
    "siglip": dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1),
    "xlm_roberta": dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1),
}


def train_sentencepiece(dst: Path, texts: list[str], vocab_size: int, layout: str) -> Path:
    """Train a unigram SentencePiece model on `texts` into `dst` (a .model file), with the special-token layout of
    the model family (`SPM_LAYOUTS`). One thread and no input sampling, so that a rebuild is byte-identical."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model, model_type="unigram", vocab_size=vocab_size,
        character_coverage=1.0, num_threads=1, shuffle_input_sentence=False, input_sentence_size=0,
        hard_vocab_limit=False, minloglevel=2, **SPM_LAYOUTS[layout])
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(model.getvalue())
    return dst
