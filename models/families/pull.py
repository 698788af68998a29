"""`crossprobe models pull SPEC`: fetch a model's files where a network exists, and say plainly where none does.

    hf:<repo id>          huggingface_hub.snapshot_download into the Hugging Face cache (an M-CLIP text tower also
                          gets its XLM-R configuration and, where open_clip imports, its paired image tower)
    open_clip:<arch>/<tag>  open_clip's own download of that pretrained tag (where open_clip imports: the export venv)
    immich:<repo id>      Immich's published folder (immich-app/ViT-B-32__openai...): its config, visual/ and textual/

Before anything is fetched the hub's host must answer a TCP connection within `timeout` seconds; every download
call gets the same timeout. Where that fails, or the user set HF_HUB_OFFLINE=1, NoNetwork says what to do instead:
download the files on a machine that has a network and name them here as a local folder or file.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from crossprobe.core.inference.spec import BadSpec, ModelSpec, parse

IMMICH_FILES = ["config.json", "visual/*", "textual/*"]


class NoNetwork(RuntimeError):
    """No download is possible from here (no network, or offline mode asked for)."""


def pull(
    spec: str | ModelSpec, timeout: float = 10.0, offline_asked: bool = False, log: Callable[[str], None] = print
) -> str:
    """Fetch the spec's files; -> the spec to use from now on (a local folder for immich:)."""
    spec = spec if isinstance(spec, ModelSpec) else parse(spec)
    if spec.family == "crossprobe":
        raise BadSpec(f"model {spec}: crossprobe's checkpoints ship with it; nothing to pull")
    if spec.path is not None and spec.path.exists():
        log(f"{spec}: a local {'folder' if spec.path.is_dir() else 'file'}, nothing to pull")
        return str(spec)
    if spec.family == "immich" and "/" not in spec.ref.strip("/"):
        raise FileNotFoundError(f"model {spec}: no folder {spec.ref}, and not a hub repo id (immich-app/<name>)")
    endpoint = _endpoint(offline_asked)
    _reachable(endpoint, timeout, spec)
    _bounded_client(timeout)
    if spec.family == "open_clip":
        return _pull_open_clip(spec, timeout, log)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = IMMICH_FILES if spec.family == "immich" else None
    try:
        folder = Path(snapshot_download(spec.ref, allow_patterns=patterns, etag_timeout=timeout))
    except LocalEntryNotFoundError as e:  # what huggingface_hub raises when the hub stops answering mid-way
        raise NoNetwork(f"{spec}: {endpoint} stopped answering ({e.__cause__ or e}). " + _ELSEWHERE) from None
    log(f"{spec.ref}: {folder}")
    if spec.family == "immich":
        return f"immich:{folder}"
    _pull_mclip_parts(folder, spec.ref, timeout, log)
    return str(spec)


def _endpoint(offline_asked: bool) -> str:
    """The hub's address, with huggingface_hub's offline switch off for this process (crossprobe's command line
    turns it on so that nothing else downloads; a user's own HF_HUB_OFFLINE=1 is kept: NoNetwork)."""
    if offline_asked:
        raise NoNetwork("HF_HUB_OFFLINE=1 is set: no download is attempted. " + _ELSEWHERE)
    os.environ["HF_HUB_OFFLINE"] = "0"
    os.environ.pop("TRANSFORMERS_OFFLINE", None)
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = False  # read once at import; this command is the one place that downloads
    return constants.ENDPOINT


def _bounded_client(timeout: float) -> None:
    """Every hub request of this process gets `timeout` seconds per connect and per read wherever it sets none:
    huggingface_hub's listing calls pass timeout=None, so a host that accepts and never answers would hang the
    command (a transport fills the request's own timeout in: httpx lets a request's None override a client's)."""
    import httpx2
    import huggingface_hub
    from huggingface_hub.utils._http import hf_request_event_hook

    class Bounded(httpx2.HTTPTransport):
        def handle_request(self, request):
            set_ = request.extensions.get("timeout") or {}
            request.extensions["timeout"] = {
                k: timeout if set_.get(k) is None else set_[k] for k in ("connect", "read", "write", "pool")
            }
            return super().handle_request(request)

    huggingface_hub.set_client_factory(
        lambda: httpx2.Client(
            transport=Bounded(), event_hooks={"request": [hf_request_event_hook]}, follow_redirects=True
        )
    )


def _reachable(endpoint: str, timeout: float, spec: ModelSpec) -> None:
    url = urlparse(endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise NoNetwork(
            f"no network: {host}:{port} did not answer within {timeout:g} s ({e or type(e).__name__}); "
            f"{spec} cannot be downloaded from here. " + _ELSEWHERE
        ) from None


_ELSEWHERE = (
    "Download the model on a machine that has a network (for instance `hf download REPO --local-dir DIR`, "
    "or open_clip's weights file), copy it here, and name it locally: hf:<dir>, "
    "open_clip:<architecture>/<weights file>, immich:<dir>."
)


def _pull_open_clip(spec: ModelSpec, timeout: float, log) -> str:
    try:
        import open_clip
    except ImportError:
        raise NoNetwork(
            f"{spec}: open_clip is not installed here; pull it in the export venv "
            f"(scripts/openclip-env.sh: artifacts/openclip-venv/bin/crossprobe models pull {spec})"
        ) from None
    cfg = open_clip.get_pretrained_cfg(spec.architecture, spec.weights)
    if not cfg:
        raise BadSpec(f"model {spec}: open_clip has no pretrained tag {spec.weights!r} for {spec.architecture!r}")
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(timeout)))
    log(f"{spec}: {open_clip.download_pretrained(cfg)}")
    return str(spec)


def _pull_mclip_parts(folder: Path, repo: str, timeout: float, log) -> None:
    """An M-CLIP text tower names XLM-R's configuration by repo (modelBase) and is paired with an open_clip image
    tower (mclip.PAIRED): fetch those too."""
    import json

    cfg = folder / "config.json"
    meta = json.loads(cfg.read_text(encoding="utf-8")) if cfg.exists() else {}
    if meta.get("model_type") != "M-CLIP":
        return
    from huggingface_hub import snapshot_download

    from crossprobe.models.families.mclip import PAIRED

    base = meta.get("modelBase", "")
    if base and not Path(base).exists():
        log(f"{base}: {snapshot_download(base, allow_patterns=['config.json'], etag_timeout=timeout)}")
    image = PAIRED.get(repo)
    if image:
        try:
            log(pull(image, timeout, log=log))
        except NoNetwork as e:
            log(f"its image tower {image}: {e}")
