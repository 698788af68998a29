"""Query languages, for the models that are told which language a query is in.

Immich's NLLB-CLIP folders (immich:<...>/nllb-clip-*) take a FLORES-200 language code in front of each query, as
Immich's own service writes it (the code, then the cleaned text, no space between: its textual encoder's rule for
models whose name starts with "nllb"), from the user's language. crossprobe's is one setting,
CROSSPROBE_QUERY_LANGUAGE (an ISO 639-1 code, or a FLORES-200 code as it is); every other model reads a query as
it is, in whatever language it was trained on (docs/models.md says which)."""

from __future__ import annotations

# ISO 639-1 -> FLORES-200, for the languages NLLB covers that people most often search in (FLORES-200 codes
# are accepted as they are, so any other of NLLB's 200 languages is one setting away)
FLORES200 = {
    "ar": "arb_Arab", "bg": "bul_Cyrl", "bn": "ben_Beng", "ca": "cat_Latn", "cs": "ces_Latn", "da": "dan_Latn",
    "de": "deu_Latn", "el": "ell_Grek", "en": "eng_Latn", "es": "spa_Latn", "et": "est_Latn", "fa": "pes_Arab",
    "fi": "fin_Latn", "fr": "fra_Latn", "he": "heb_Hebr", "hi": "hin_Deva", "hr": "hrv_Latn", "hu": "hun_Latn",
    "id": "ind_Latn", "it": "ita_Latn", "ja": "jpn_Jpan", "ko": "kor_Hang", "lt": "lit_Latn", "lv": "lvs_Latn",
    "nb": "nob_Latn", "nl": "nld_Latn", "pl": "pol_Latn", "pt": "por_Latn", "ro": "ron_Latn", "ru": "rus_Cyrl",
    "sk": "slk_Latn", "sl": "slv_Latn", "sr": "srp_Cyrl", "sv": "swe_Latn", "sw": "swh_Latn", "th": "tha_Thai",
    "tr": "tur_Latn", "uk": "ukr_Cyrl", "vi": "vie_Latn", "zh": "zho_Hans",
}  # fmt: skip


def flores(language: str) -> str:
    """ "pl", "pl-PL", "pl_PL" or "pol_Latn" -> "pol_Latn"; a ValueError names what is accepted."""
    lang = language.strip()
    if len(lang) == 8 and lang[3] == "_":  # already a FLORES-200 code (xxx_Scri)
        return lang
    base = lang.replace("_", "-").split("-")[0].lower()
    if base in FLORES200:
        return FLORES200[base]
    raise ValueError(
        f"query language {language!r}: an ISO 639-1 code ({', '.join(sorted(FLORES200))}) or a FLORES-200 code "
        "(pol_Latn)"
    )
