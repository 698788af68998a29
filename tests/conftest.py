import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
torch.set_num_threads(2)

# The service answers only the Hosts in CROSSPROBE_ALLOWED_HOSTS (the loopback names by default:
# service/host_guard.py). An in-process TestClient names itself "testserver"; here it is localhost, as a local
# client would be (tests/service/test_host_guard.py sends other names on purpose).
from starlette import testclient as _testclient  # noqa: E402

_client_init = _testclient.TestClient.__init__


def _localhost_client(self, app, base_url="http://localhost", *args, **kwargs):
    _client_init(self, app, base_url, *args, **kwargs)


_testclient.TestClient.__init__ = _localhost_client


@pytest.fixture(scope="session")
def milvus_server():
    """A real Milvus standalone server (2.3.5, PyPI's `milvus` wheel, installed on first use into
    artifacts/milvus-server/venv by benchmarks.support.local_milvus) on a free loopback port with a temp
    data dir, stopped by PID. Only tests marked milvus_server use it (`make test-milvus`)."""
    from benchmarks.support.local_milvus import LocalMilvus

    with LocalMilvus() as server:
        yield server


@pytest.fixture(scope="session")
def no_torch(tmp_path_factory):
    """A folder whose `torch` package raises ImportError: put first on a subprocess's PYTHONPATH, it hides the real
    torch, as in an installation without it (the container image, `pip install crossprobe`)."""
    d = tmp_path_factory.mktemp("no-torch")
    (d / "torch").mkdir()
    (d / "torch" / "__init__.py").write_text("raise ImportError('no torch in this installation (test)')\n")
    return d


@pytest.fixture(scope="session")
def bert():
    from crossprobe.models.backbones import load_minilm

    return load_minilm()


@pytest.fixture(scope="session")
def small_cfg():
    """A small but complete model config (real MiniLM text backbone, small heads)."""
    from crossprobe.models.bridge import BridgeConfig
    from crossprobe.models.cross_probe import CrossProbeConfig
    from crossprobe.models.model import ModelConfig
    from crossprobe.models.region_labels import RegionConfig
    from crossprobe.models.research.single_stream import SingleStreamConfig
    from crossprobe.models.research.split_merge import SplitMergeConfig
    from crossprobe.models.temde import TemdeConfig
    from crossprobe.models.text_tower import TextTowerConfig
    from crossprobe.models.vision_tower import VisionTowerConfig

    return ModelConfig(
        text=TextTowerConfig(d=64, finetune_layers=1),
        vision=VisionTowerConfig(d=64, layers=1, heads=4),
        cp=CrossProbeConfig(d=32, m=3, n=4, layers=1, heads=4, inputs="tower"),
        temde=TemdeConfig(N=4, K=4, inner=4, inputs="tower"),
        sm=SplitMergeConfig(d=32, layers=1, heads=4),
        tv=SingleStreamConfig(d=32, layers=2, heads=4),
        bridge=BridgeConfig(beta=0.5, top_t=5),  # the label bridge on, as in the default checkpoint
        # region labels on (off in the default checkpoint), so that their graphs, index field and service path are tested
        region=RegionConfig(weights={"cp": 0.2, "temde": 0.3}, pool=3),
    )


def random_labels(model):
    """Give a fresh model's label bridge random unit class embeddings (training computes them from the text
    tower), so that tests of everything downstream see a bridge that moves g_I."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.bridge.class_emb.copy_(torch.nn.functional.normalize(torch.randn(model.bridge.class_emb.shape, generator=g), dim=-1))
    return model


@pytest.fixture()
def small_model(small_cfg, bert):
    import copy

    from crossprobe.models.model import SearchModel

    torch.manual_seed(0)
    return random_labels(SearchModel(copy.deepcopy(small_cfg), bert)).eval()


@pytest.fixture(scope="session")
def tiny_heads(tmp_path_factory):
    """Reranker heads trained by `crossprobe train --backbone` on a tiny random HF CLIP (tests/support/tiny_heads.py)."""
    from tests.support import tiny_heads as th

    return th.build(tmp_path_factory.mktemp("tiny-heads"))
