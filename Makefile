# crossprobe: every target sets itself up from nothing (a virtualenv in .venv).
# The development venv is Python 3.11 (the full suite, torch included; the torch-free core installs on 3.11 to 3.13:
# make wheel-check); PY names it when it is not python3.11 on PATH.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# torch first, pinned, its CPU build: a plain `torch` requirement resolved on PyPI pulls the multi-GB CUDA build.
# A local wheel source pip is configured with (find-links: PIP_FIND_LINKS or pip.conf, as on machines with no
# route to PyTorch's index) is used when it holds the pin; otherwise PyTorch's CPU index, or a mirror of it named
# by TORCH_INDEX_URL. Never PyPI's plain index: there torch==2.13.0 is the CUDA build.
TORCH           ?= torch==2.13.0
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu

.PHONY: venv system demo test constraints wheel-check first-run clip-retrieval-env peer-bench test-e2e test-chaos test-fuzz test-milvus test-upgrade milvus-server openclip-env test-openclip image test-deploy train eval frontier ablation export bench bench-load clean

$(STAMP): pyproject.toml constraints.txt
	@command -v $(PY) >/dev/null 2>&1 || { echo "need Python 3.11 as $(PY): the development venv (torch==2.13.0's CPU wheel) is 3.11. Install it (docs/getting-started.md#what-you-need), or name it: make ... PY=/path/to/python3.11"; exit 1; }
	@$(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "$(PY) is Python $$($(PY) -c 'import platform; print(platform.python_version())'); the development venv needs 3.11: make ... PY=/path/to/python3.11 (docs/getting-started.md#what-you-need)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# --no-deps: a local source may hold torch alone; its dependencies come with the project's install below
	@if $(BIN)/pip install -q --no-index --no-deps '$(TORCH)' 2>/dev/null; then \
	  echo "$(TORCH): already installed, or from the local wheels pip is configured with"; \
	else \
	  echo "$(TORCH): the CPU build from $(TORCH_INDEX_URL)"; $(BIN)/pip install -q --index-url '$(TORCH_INDEX_URL)' '$(TORCH)'; \
	fi
	@# constraints.txt: the versions `make test` passed with (scripts/constraints.sh; the image and CI use it too)
	$(BIN)/pip install -q -c constraints.txt -e '.[torch,dev,ocr]'
	touch $(STAMP)

## make constraints: constraints.txt from .venv as it is (after changing dependencies on purpose; then make test)
constraints:
	scripts/constraints.sh

venv: $(STAMP)

## make system: the real components the tests use, from Debian's packages when missing (scripts/system-deps.sh
## lists them with why, prints what it installs before it does, and runs nothing when all are there)
system:
	scripts/system-deps.sh

## make demo [IMAGES=dir]: index a small gallery, serve it (embedded Redis), query it over HTTP, stop
demo: $(STAMP)
	$(BIN)/crossprobe demo-service $(if $(IMAGES),--images $(IMAGES),)

## make test: the fast test suite (no shared data needed)
test: $(STAMP) system
	$(BIN)/python -m pytest -p no:cacheprovider

## make wheel-check: the wheel without torch on Python 3.11, 3.12 and 3.13 (pyenv's, or PYTHONS=path,...): a fresh
## venv each, a model exported beforehand indexed and served there, the same answers on every Python
## (scripts/wheel_check.py -> docs/research/results/wheel_check.json; downloads the dependencies' wheels once)
wheel-check: $(STAMP)
	PYTHONPATH=. $(BIN)/python scripts/wheel_check.py $(if $(PYTHONS),--pythons $(PYTHONS),)

## make first-run: a user's first run counted on a fresh Python 3.13 venv without torch (PY313=path to name one):
## pip install the wheel, then `crossprobe serve --images DIR --model immich:<repo>` against a local stand-in hub
## (scripts/first_run.py -> docs/research/results/first_run.json)
first-run: $(STAMP)
	PYTHONPATH=.:scripts $(BIN)/python scripts/first_run.py $(if $(PY313),--python $(PY313),)

## make test-e2e: the web page in a real browser: Playwright (the e2e extra) drives Debian's chromium (installed
## when missing; no browser download) against a live server over the committed checkpoint; screenshots -> artifacts/e2e/.
## Also clip-retrieval's own front-end (its static build from the clip-retrieval 2.45.0 wheel, which
## `pip download` fetches from PyPI once into artifacts/clip_front/wheel/) on a second origin -> artifacts/clip_front/
test-e2e: $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[e2e]'
	WITH_BROWSER=1 scripts/system-deps.sh
	$(BIN)/python -m pytest -p no:cacheprovider -m e2e -s

## make test-chaos: the indexer's crash safety: `crossprobe index build|add|delete|reindex` SIGKILLed at every
## injection point and at 8 random moments each (CROSSPROBE_CHAOS_TIMED=n for more), every resume compared with an
## uninterrupted run (~5 min on 2 cores; 2 per command run in `make test`) -> docs/research/results/indexer_kill.json
test-chaos: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -m chaos -s tests/indexer/jobs/test_kill_runs.py

## make test-fuzz: schemathesis (the fuzz extra) against the service's own OpenAPI document on a live
## `crossprobe serve` over a real tiny index, every check, >= 1,000 generated requests; no 5xx, no failed check and
## no server traceback allowed (a few minutes). A fresh seed each run, printed first with its replay command;
## CROSSPROBE_FUZZ_SEED=n replays one, CROSSPROBE_FUZZ_EXAMPLES=n (default 150) sizes it. Each run is appended to
## docs/research/results/fuzz.json (docs/research/reliability.md, "API fuzzing"). `make test` (and CI) runs none.
test-fuzz: $(STAMP)
	$(BIN)/pip install -q -c constraints.txt -e '.[fuzz]'
	$(BIN)/python -m pytest -p no:cacheprovider -m fuzz -s tests/service/test_fuzz.py

## make test-upgrade: an index built by the previous release's own code (0.1.0: a git worktree of its commit, run in
## this venv) served as it is, and refused under this release's model with the one command that migrates it, which
## is then run (~2 min; needs the git history) -> docs/research/results/upgrade.json
test-upgrade: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -m upgrade -s tests/storage/test_previous_release.py

## make test-milvus: the Milvus backend against a real Milvus 2.3.5 standalone server (PyPI's `milvus` wheel, installed
## on first use into artifacts/milvus-server/venv, its own virtualenv; started by the tests on a free port, stopped by
## PID): versions as collections (build, add, delete, activate, reindex, gc), every filter form, /v1/search with the
## server paused and killed mid-search (503 ann_unavailable, never a 500) and restarted (~3 min; `make test` runs the
## same backend tests on milvus-lite only)
test-milvus: $(STAMP) milvus-server
	$(BIN)/python -m pytest -p no:cacheprovider -m milvus_server tests/storage/ann tests/service/test_milvus_search.py \
		tests/service/test_milvus_server.py

## make milvus-server: install that server's virtualenv (artifacts/milvus-server/venv; the tests do it too when missing)
milvus-server: $(STAMP)
	$(BIN)/python -c "from benchmarks.support.local_milvus import ensure_server; print(ensure_server())"

## make openclip-env: open_clip's export environment (issue 47), a virtualenv of its own in $(OPENCLIP_VENV): torch 2.14.1 +
## torchvision 0.29.1 (PyPI's builds, which run on CPU; no CPU torchvision exists for the main .venv's torch 2.13.0),
## open-clip-torch, multilingual-clip, clip-benchmark, transformers, onnx(runtime), crossprobe editable (scripts/openclip-env.sh)
OPENCLIP_VENV ?= artifacts/openclip-venv
openclip-env:
	scripts/openclip-env.sh $(OPENCLIP_VENV)

## make test-openclip: the tests marked openclip (the open_clip and M-CLIP references, tests/support; their exports and
## Immich folders, tests/models; M-CLIP's multilingual queries through the API, tests/service) in that venv
test-openclip: openclip-env
	$(OPENCLIP_VENV)/bin/python -m pytest -p no:cacheprovider -m openclip tests/support tests/models tests/service/test_model_choice.py

## make peer-bench: crossprobe beside clip-retrieval 2.45.0 (its own venv, scripts/clip-retrieval-env.sh) over the
## same random open_clip ViT-B-32, photos and /knn-service requests, then the per-model thread profiles
## (benchmarks/peer_clip_retrieval.py, benchmarks/serving_profiles.py; Flickr8k needed; about 10 minutes)
clip-retrieval-env:
	scripts/clip-retrieval-env.sh
peer-bench: $(STAMP) openclip-env clip-retrieval-env
	$(BIN)/python -m benchmarks.peer_clip_retrieval --variants "before_profiles:CROSSPROBE_THREADS=1,CROSSPROBE_ORT_SHARED_POOL=true"
	$(BIN)/python -m benchmarks.serving_profiles

## make image: the CPU image crossprobe:cpu from the Dockerfile, with docker when an engine answers, else podman
## (installed when missing, with local stand-ins for the images no registry gives here: scripts/container-setup.sh,
## scripts/build-image.sh; NO_CACHE=1 from scratch)
image:
	scripts/container-setup.sh
	scripts/build-image.sh

## make test-deploy: the committed docker-compose.yml run for real (podman-compose; Grafana left out: no package
## here) and checked against its containers: each one running right after `up` (else it stops there, quoting podman),
## health, indexing, search, page, Prometheus, reindex, restart, SIGTERM, uid, Redis stopped and started;
## measured -> docs/research/results/deploy.json; then, on a stack of its own, a replica killed under load behind
## the proxy -> docs/research/results/replicas.json (~10 min after make image)
test-deploy: $(STAMP) image
	$(BIN)/python -m pytest -p no:cacheprovider -m deploy -s tests/deploy/test_stack.py tests/deploy/test_replicas.py

## make train: the default training run on ../shared/datasets/flickr8k (resumable)
train: $(STAMP)
	$(BIN)/crossprobe train

## make eval: the Flickr8k test protocol -> docs/research/flickr8k.md, docs/research/results/flickr8k.json
eval: $(STAMP)
	$(BIN)/crossprobe eval --docs docs/research

## make frontier: four CP settings trained on the committed towers, the default chosen on dev
## -> docs/research/frontier.md, docs/research/results/frontier.json (resumable; ~50 min on 2 cores)
frontier: $(STAMP)
	$(BIN)/crossprobe frontier --docs docs/research

## make ablation: SEAM / ACE-RPE / ZoDIAC / T-EMDE pooling trained and measured against the default
## -> docs/research/ablation.md, docs/research/results/ablation.json (resumable; ~3 h on 2 cores: tower options ~21 min each, TV rows up to 30)
ablation: $(STAMP)
	$(BIN)/crossprobe ablate --docs docs/research

export: $(STAMP)
	$(BIN)/crossprobe export

## make bench: the speed targets, each written to docs/research/ with its machine and command (Flickr8k needed; CPU idle):
## CP frontier on test -> docs/research/frontier_test.md (first runs `crossprobe frontier` for settings not trained
## under the current CP recipe: ~20 min each); ONNX Runtime thread pools -> docs/research/ort_threading.md;
## the search service, 8,091 and 100K items -> docs/research/latency.md
bench: $(STAMP)
	$(BIN)/python -m benchmarks.cp_frontier
	$(BIN)/python -m benchmarks.ort_threading
	$(BIN)/python -m benchmarks.service_bench --requests 300

## make bench-load: load, soak and Redis chaos under load (issue 16 item 6; Flickr8k needed; ~30 min) -> docs/research/results/
## load.json, redis_faults_load.json (docs/research/reliability.md): max sustainable searches/s at p99 <= 100 ms per rerank mode
## on 8,091 and 100K items, a 10-minute soak at 80% of cp's, Redis paused 10 s and killed under that load, a py-spy
## profile. Each step runs under $(LOCK) (a machine shared with training jobs; LOCK= to run without)
LOCK ?= flock /tmp/crossprobe-cpu.lock
bench-load: $(STAMP)
	$(BIN)/pip install -q py-spy
	$(LOCK) $(BIN)/python -m benchmarks.load_bench max-qps --start 60 --step-s 8
	$(LOCK) $(BIN)/python -m benchmarks.load_bench soak --minutes 10
	$(LOCK) $(BIN)/python -m benchmarks.redis_faults --rate $$($(BIN)/python -c "import json; print(json.load(open('docs/research/results/load.json'))['soak']['results']['rate'])") \
		--pause-s 10 --down-s 10 --phase-s 10 --images 128 --out docs/research/results/redis_faults_load.json
	$(LOCK) $(BIN)/python -m benchmarks.load_bench profile --clients 16 --seconds 20 --label after

clean:
	rm -rf $(VENV) artifacts .pytest_cache
