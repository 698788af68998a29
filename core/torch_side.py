"""The one door from the torch-free core to the torch part (crossprobe.models): a module of it by name, imported
only when the core needs what only PyTorch gives (a graph to export, an in-memory model to describe, the PyTorch
GPU backend). Where torch is not installed, TorchUnavailable says which extra to install.

By name (importlib), not by an import statement, so that the layers contract (.importlinter: the core, the
storage layer, the jobs and the service never import torch or crossprobe.models) holds for every code path that
serves or indexes with exported graphs; tests/deploy/test_torch_free_runtime.py runs those paths with torch
absent."""

from __future__ import annotations

import importlib
from types import ModuleType

EXTRA = "torch"  # pyproject.toml's optional dependencies: PyTorch and the exporters' libraries
INSTALL = (
    f"pip install 'crossprobe[{EXTRA}]' (PyTorch's CPU build first where the default is the CUDA one: "
    f"pip install torch --index-url https://download.pytorch.org/whl/cpu)"
)


class TorchUnavailable(RuntimeError):
    """What was asked needs PyTorch (or an exporter's library), and this installation has none."""


def module(name: str, why: str) -> ModuleType:
    """crossprobe.models.<name>, or TorchUnavailable naming `why` and what to install."""
    try:
        return importlib.import_module(f"crossprobe.models.{name}")
    except ImportError as e:
        raise TorchUnavailable(f"{why} needs PyTorch, which this installation lacks ({e}): {INSTALL}") from None
