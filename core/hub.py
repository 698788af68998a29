"""Fetching a model's files from the Hugging Face hub (or the hub HF_ENDPOINT names), torch-free: the one place
crossprobe downloads.

    snapshot(repo, patterns, timeout, log)   the repo's files in the Hugging Face cache: found there, else fetched

Downloads happen where a model is named that this machine does not have (`crossprobe serve --model SPEC`, the
index commands, `crossprobe models pull`), never otherwise. Before anything is fetched the hub's host must answer
a TCP connection within `timeout` seconds, and every request of the download gets the same timeout, so a dead or
silent hub ends the command with NoNetwork (what to do instead) rather than a hang. A connection cut mid-file is
resumed where it stopped (huggingface_hub asks for the rest, up to five times); once it gives up, the files it
fetched whole stay in the cache and the next try fetches only the others. The user's own HF_HUB_OFFLINE=1 means no
download is attempted: crossprobe's command line sets that variable for the libraries it runs (so nothing else
downloads), and records the user's own value first (remember_user_offline).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

# the user's own HF_HUB_OFFLINE, as it was before crossprobe's command line set it to 1 (cli/__init__.py); None:
# not recorded (a library caller), then the variable itself is read
_USER_OFFLINE: str | None = None

ELSEWHERE = (
    "Download the model on a machine that has a network (for instance `hf download REPO --local-dir DIR`, "
    "or open_clip's weights file), copy it here, and name it locally: hf:<dir>, "
    "open_clip:<architecture>/<weights file>, immich:<dir>."
)


class NoNetwork(RuntimeError):
    """No download is possible from here (no network, a hub that stops answering, or offline mode asked for)."""


def remember_user_offline() -> None:
    """Record the user's HF_HUB_OFFLINE before the command line sets it (once per process)."""
    global _USER_OFFLINE
    if _USER_OFFLINE is None:
        _USER_OFFLINE = os.environ.get("HF_HUB_OFFLINE", "")


def offline_asked() -> bool:
    """The user set HF_HUB_OFFLINE=1 (before crossprobe's command line set it for the libraries)."""
    value = os.environ.get("HF_HUB_OFFLINE", "") if _USER_OFFLINE is None else _USER_OFFLINE
    return value.strip().lower() in ("1", "true", "yes", "on")


def cached(repo: str, patterns: list[str] | None = None) -> Path | None:
    """The repo's snapshot folder in the Hugging Face cache, where every file `patterns` asks for is there."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        return None


def snapshot(
    repo: str, patterns: list[str] | None, timeout: float, log: Callable[[str], None] = print, what: str = ""
) -> Path:
    """The repo's files in the Hugging Face cache (fetched now unless there), with a progress bar per file."""
    found = cached(repo, patterns)
    if found is not None:
        return found
    what = what or repo
    endpoint = allow_downloads(what)
    reachable(endpoint, timeout, what)
    bounded_client(timeout)
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    log(f"{what}: downloading {repo} from {endpoint}")
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, etag_timeout=timeout))
    # LocalEntryNotFoundError: the hub stopped answering before the file list; a transport error: during a file,
    # after huggingface_hub's own retries (each resumed where the last stopped)
    except (LocalEntryNotFoundError, httpx2.TransportError) as e:
        raise NoNetwork(
            f"{what}: {endpoint} stopped answering ({e.__cause__ or e}); the files fetched whole are kept, and the "
            "next try fetches only the others. " + ELSEWHERE
        ) from None


def allow_downloads(what: str) -> str:
    """Turn huggingface_hub's offline switch off for this process (crossprobe's command line turns it on so that
    nothing else downloads); -> the hub's address. The user's own HF_HUB_OFFLINE=1: NoNetwork."""
    if offline_asked():
        raise NoNetwork(f"{what}: HF_HUB_OFFLINE=1 is set: no download is attempted. " + ELSEWHERE)
    os.environ["HF_HUB_OFFLINE"] = "0"
    os.environ.pop("TRANSFORMERS_OFFLINE", None)
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = False  # read once at import
    return constants.ENDPOINT


def bounded_client(timeout: float) -> None:
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

    from huggingface_hub import constants

    # the file downloads pass this one explicitly (its default: 10 s), so the transport would not fill it in
    constants.HF_HUB_DOWNLOAD_TIMEOUT = max(1, round(timeout))  # an int in huggingface_hub
    huggingface_hub.set_client_factory(
        lambda: httpx2.Client(
            transport=Bounded(), event_hooks={"request": [hf_request_event_hook]}, follow_redirects=True
        )
    )


def reachable(endpoint: str, timeout: float, what: str) -> None:
    url = urlparse(endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise NoNetwork(
            f"no network: {host}:{port} did not answer within {timeout:g} s ({e or type(e).__name__}); "
            f"{what} cannot be downloaded from here. " + ELSEWHERE
        ) from None
