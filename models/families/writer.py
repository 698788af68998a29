"""Writing one exported folder (the layout: core/inference/exported.py), the same way for every family.

1. the tokenizer: tokenizer.json through the serving code (exported.tokenize) must give the family tokenizer's
   own ids for every probe text (text.PROBE), or nothing is written (TokenizerMismatch);
2. the fingerprint: SHA-256 over the identity (family, architecture, preprocessing and text settings, the
   tokenizer's vocabulary) and the weights' bytes, first 16 hex: the same weights give the same folder;
3. the graphs: image.onnx and text.onnx traced from the towers, each run by ONNX Runtime against PyTorch on probe
   inputs (embeddings within 1e-4 at unit norm, or nothing is written);
4. the write: everything into a temp folder beside the final one, model.json last, then one rename, so a reader
   (inference.exported_folder scanning <root>/*/model.json) never sees half a folder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from crossprobe.core.atomic import atomic_path
from crossprobe.core.inference.exported import FORMAT, MODEL_JSON, text_tokenizer, tokenize, unit
from crossprobe.models.families.base import FamilyModel, TokenizerMismatch
from crossprobe.models.families.text import PROBE

log_ = logging.getLogger("crossprobe.models.families")
OPSET = 17
GRAPH_TOLERANCE = 1e-4  # max |ONNX Runtime - PyTorch| of unit-norm embeddings on the probe inputs


def write(m: FamilyModel, root: Path, log: Callable[[str], None] | None = None) -> Path:
    """<root>/<fingerprint>/ for `m` (module docstring); an existing folder of the same fingerprint is kept and
    `m.spec` recorded in it. A progress bar (on a terminal) counts the four steps: an export takes minutes."""
    say = log or log_.info
    with tqdm(total=4, desc=f"exporting {m.spec}", unit="step", disable=None, leave=False) as bar:
        say(check_tokenizer(m))
        bar.update()
        fp = fingerprint(m)
        bar.update()
        root.mkdir(parents=True, exist_ok=True)
        final = root / fp
        if (final / MODEL_JSON).exists():
            record_alias(final, m)
            say(f"{final}: already exported (fingerprint {fp})")
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{fp}.", suffix=".tmp", dir=root))
        try:
            dims = _export_graphs(m, tmp, say)
            bar.update()
            (tmp / "tokenizer.json").write_text(m.tokenizer_json, encoding="utf-8")
            _write_json(tmp / MODEL_JSON, model_json(m, fp, dims))  # last: a folder with model.json is complete
            os.chmod(tmp, 0o755)  # mkdtemp's 0700
            try:
                os.rename(tmp, final)
            except OSError:  # another export of the same weights finished first: theirs is the same folder
                if not (final / MODEL_JSON).exists():
                    raise
                record_alias(final, m)
            bar.update()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"{final}: exported {m.spec} (fingerprint {fp})")
    return final


# ---- 1. the tokenizer -------------------------------------------------------------------------------------
def check_tokenizer(m: FamilyModel, texts: list[str] = PROBE) -> str:
    """Raise TokenizerMismatch unless tokenizer.json, set up as model.json says and cleaned as it says, gives the
    family tokenizer's own ids for each text (each alone, as a query comes)."""
    tok = text_tokenizer(m.tokenizer_json, m.text_cfg)
    wrong = []
    for t in texts:
        ids, _ = tokenize(tok, m.text_cfg, [t])
        want = list(m.reference_ids(t))
        if ids[0].tolist() != want:
            wrong.append(
                f"{t!r}: tokenizer.json gives {ids[0].tolist()[:16]}..., the family's tokenizer {want[:16]}..."
            )
    if wrong:
        raise TokenizerMismatch(
            f"{m.spec}: the converted tokenizer disagrees with {m.family}'s own on "
            f"{len(wrong)} of {len(texts)} probe texts; not exported:\n  " + "\n  ".join(wrong[:5])
        )
    return f"tokenizer: ids equal to {m.family}'s own tokenizer on {len(texts)} probe texts"


# ---- 2. the fingerprint -----------------------------------------------------------------------------------
def fingerprint(m: FamilyModel) -> str:
    from tokenizers import Tokenizer

    identity = {
        "family": m.family,
        "identity": m.identity,
        "image": m.image_cfg,
        "text": m.text_cfg,
        "vocab": sorted(Tokenizer.from_str(m.tokenizer_json).get_vocab(with_added_tokens=True).items()),
    }
    h = hashlib.sha256(json.dumps(identity, sort_keys=True, ensure_ascii=False).encode("utf-8"))
    for name in sorted(m.state):
        t = m.state[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


# ---- 3. the graphs ----------------------------------------------------------------------------------------
def _export_graphs(m: FamilyModel, folder: Path, say: Callable[[str], None]) -> dict:
    """image.onnx and text.onnx in `folder`, each checked against PyTorch; -> model.json's "dims"."""
    size = int(m.image_cfg["size"])
    pixels = torch.from_numpy(np.random.default_rng(0).normal(size=(2, 3, size, size)).astype(np.float32))
    ids, mask = tokenize(text_tokenizer(m.tokenizer_json, m.text_cfg), m.text_cfg, PROBE[:8])
    feed = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
    text_args = tuple(feed[n] for n in m.text_cfg["inputs"])
    # a tower with a fixed context (SigLIP; open_clip where its tower is not causal)
    fixed_t = bool(m.text_cfg.get("pad_to_context")) and not m.trims_padding
    text_axes = {n: {0: "batch"} if fixed_t else {0: "batch", 1: "tokens"} for n in m.text_cfg["inputs"]}
    with torch.inference_mode():
        img_emb, img_tok = m.image(pixels)
        txt_emb, txt_tok = m.text(*text_args)
    _onnx(
        m.image,
        (pixels,),
        folder / "image.onnx",
        ["pixels"],
        {"pixels": {0: "batch"}},
        {"embedding": {0: "batch"}, "tokens": {0: "batch"}},
    )
    _onnx(
        m.text,
        text_args,
        folder / "text.onnx",
        list(m.text_cfg["inputs"]),
        text_axes,
        {"embedding": {0: "batch"}, "tokens": {0: "batch"} if fixed_t else {0: "batch", 1: "tokens"}},
    )
    for name, feeds, want in [
        ("image", {"pixels": pixels}, img_emb),
        ("text", dict(zip(m.text_cfg["inputs"], text_args)), txt_emb),
    ]:
        diff = _graph_diff(folder / f"{name}.onnx", feeds, want)
        say(f"{name}.onnx: max |ONNX Runtime - PyTorch| at unit norm = {diff:.1e}")
        if not diff <= GRAPH_TOLERANCE:
            raise RuntimeError(
                f"{m.spec}: the exported {name} graph differs from PyTorch by {diff:.1e} "
                f"(> {GRAPH_TOLERANCE}); not exported"
            )
    return {
        "d": int(img_emb.shape[-1]),
        "grid": [int(img_tok.shape[1]), int(img_tok.shape[2])],
        "text_width": int(txt_tok.shape[-1]),
    }


def _onnx(module, args, path: Path, inputs: list[str], in_axes: dict, out_axes: dict) -> None:
    """One graph at `path`; a graph over protobuf's 2 GiB (XLM-R large) keeps its weights in one <name>.data file
    beside it (the exporter writes one file per tensor)."""
    import warnings

    fastpath = torch.backends.mha.get_fastpath_enabled()
    # nn.MultiheadAttention's inference fast path (open_clip's towers) is one fused op ONNX has no export for
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with warnings.catch_warnings(), torch.inference_mode(), tempfile.TemporaryDirectory(dir=path.parent) as d:
            warnings.simplefilter("ignore")  # tracer warnings about python values in the libraries' code
            raw = Path(d) / path.name
            torch.onnx.export(
                module.eval(),
                args,
                str(raw),
                input_names=inputs,
                output_names=["embedding", "tokens"],
                dynamic_axes={**in_axes, **out_axes},
                opset_version=OPSET,
                dynamo=False,
            )
            if len(list(Path(d).iterdir())) == 1:
                os.replace(raw, path)
            else:
                import onnx

                onnx.save_model(
                    onnx.load(str(raw)),
                    str(path),
                    save_as_external_data=True,
                    all_tensors_to_one_file=True,
                    location=f"{path.name}.data",
                )
                os.chmod(f"{path}.data", 0o644)  # onnx writes it 0600: a service running as another user reads it
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def _graph_diff(path: Path, feeds: dict, want: torch.Tensor) -> float:
    from crossprobe.core import runtime

    sess = runtime.session(path, None)
    got = sess.run(["embedding"], {k: v.numpy() for k, v in feeds.items()})[0]
    return float(np.abs(unit(got) - unit(want.numpy())).max())


# ---- 4. the folder ----------------------------------------------------------------------------------------
def model_json(m: FamilyModel, fp: str, dims: dict) -> dict:
    return {
        "format": FORMAT,
        "family": m.family,
        "spec": m.spec,
        "name": m.name,
        "fingerprint": fp,
        "source": m.source,
        "dims": dims,
        "image": m.image_cfg,
        "text": m.text_cfg,
        "graphs": {"image": "image.onnx", "text": "text.onnx"},
        "trims_padding": m.trims_padding,
        "exported_with": m.versions,
    }


def record_alias(folder: Path, m: FamilyModel) -> None:
    """Another spec naming the same weights: model.json's "aliases" gets it, so exported.find_exported finds the
    folder by either spec (model.json is replaced whole, atomically). A spec already recorded gets its source
    record refreshed: the same weights written again (a new download, a copy) have new file times, and the same
    fingerprint proves the bytes are the ones exported, so the folder serves them again."""
    meta = json.loads((folder / MODEL_JSON).read_text(encoding="utf-8"))
    aliases = meta.get("aliases") or {}
    if meta.get("spec") == m.spec:
        if meta.get("source") == m.source:
            return
        meta["source"] = m.source
    else:
        if m.spec in aliases and aliases[m.spec] == m.source:
            return
        meta.setdefault("aliases", {})[m.spec] = m.source
    _write_json(folder / MODEL_JSON, meta)


def _write_json(path: Path, obj: dict) -> None:
    with atomic_path(path, mode=0o644, unique=True) as tmp:
        tmp.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
