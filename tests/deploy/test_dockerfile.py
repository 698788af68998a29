"""The Dockerfile, without a Docker engine: hadolint (the real linter, from the dev extra) finds nothing at
any severity, every rule it is told to ignore says why, and the facts the image relies on hold (CPU base by
default, torch's CPU wheel before the project, non-root, volumes where the settings point, /readyz health).
The health check's command itself runs against a live service in test_prometheus_live.py."""
from __future__ import annotations

import fnmatch
import json
import re
import tomllib

from tests.deploy.conftest import REPO, run, tool

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped, as Docker reads them."""
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def env_of(instrs) -> dict[str, str]:
    env = {}
    for word, rest in instrs:
        if word == "ENV":
            for k, v in re.findall(r"(\w+)=(\S+)", rest):
                env[k] = v
    return env


def stages(instrs) -> dict[str, list[tuple[str, str]]]:
    """stage name -> its instructions (FROM ... AS name)."""
    out, cur = {}, None
    for word, rest in instrs:
        if word == "FROM":
            cur = rest.split()[-1]
            out[cur] = []
        elif cur:
            out[cur].append((word, rest))
    return out


def test_hadolint_is_clean_at_every_severity():
    p = run([tool("hadolint"), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)])
    assert p.returncode == 0 and not p.stdout.strip(), p.stdout + p.stderr


def test_every_hadolint_ignore_is_justified_in_a_comment():
    lines = DOCKERFILE.read_text().splitlines()
    pragmas = [i for i, line in enumerate(lines) if "hadolint ignore=" in line]
    assert pragmas, "no ignores: drop this test's reason to exist, not the test"
    for i in pragmas:
        rules = re.search(r"hadolint ignore=([\w,]+)", lines[i]).group(1).split(",")
        above = []  # the comment block right above the pragma
        j = i - 1
        while j >= 0 and lines[j].lstrip().startswith("#"):
            above.append(lines[j])
            j -= 1
        why = " ".join(above)
        for rule in rules:
            assert rule in why and len(why) > 60, f"line {i + 1}: ignore {rule} without a comment saying why"


def test_image_facts():
    instrs = instructions()
    st = stages(instrs)
    args = {rest.split("=")[0]: rest.split("=", 1)[1] for w, rest in instrs if w == "ARG" and "=" in rest}
    assert args["VARIANT"] == "cpu"  # CPU unless asked
    # the public defaults: only these two may be substituted on a machine that cannot reach them (make image)
    assert args["BASE_IMAGE"] == "python:3.11-slim-bookworm"
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu" and args["TORCH_FIND_LINKS"] == ""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    # the base image's python (3.11) is one the package supports: the torch-free core installs on 3.11 and later
    assert pyproject["requires-python"] == ">=3.11" and args["BASE_IMAGE"].startswith("python:3.11")
    assert set(st) == {"model", "graphs", "base", "builder", "slim", "runtime"}
    # stage names are plain words: buildah (podman build) does not resolve a stage name built from an ARG
    assert [rest for w, rest in instrs if w == "FROM"] == ["scratch AS model", "scratch AS graphs",
                                                           "${BASE_IMAGE} AS base", "base AS builder",
                                                           "builder AS slim", "base AS runtime"]

    # torch: the CPU wheel, the version `make venv` installs (the Makefile's TORCH), installed before anything that
    # depends on it; the torch extra's requirement is a floor it meets
    builder = [rest for w, rest in st["builder"] if w == "RUN"]
    torch_pin = re.search(r"^TORCH\s*\?=\s*(\S+)", (REPO / "Makefile").read_text(), re.M).group(1)
    floor = next(d for d in pyproject["optional-dependencies"]["torch"] if d.startswith("torch"))
    assert torch_pin == "torch==2.13.0" and floor.startswith("torch>=") and not any(
        d.startswith("torch") for d in pyproject["dependencies"])
    first = next(i for i, r in enumerate(builder) if "pip install" in r)
    assert f'pip install {torch_pin} --index-url "$TORCH_INDEX_URL"' in builder[first]
    assert any("pip install -c constraints.txt -r /tmp/requirements.txt" in r for r in builder[first + 1:])
    # every graph exported at build time, into the folder the runtime's settings name
    assert any("crossprobe export --out /opt/crossprobe/graphs" in r for r in builder)
    # the gpu fix-up swaps exactly the gpu extra's packages for their CPU twins
    gpu_names = {re.split(r"[<>=!~ ]", d)[0] for d in pyproject["optional-dependencies"]["gpu"]}
    assert gpu_names == {"faiss-gpu", "onnxruntime-gpu"}
    fixup = next(r for r in builder if "VARIANT\" = gpu" in r)
    assert "pip uninstall -y faiss-cpu onnxruntime" in fixup and "faiss-gpu|onnxruntime-gpu" in fixup
    # the slim venv: torch out, and a build-time check that serve and index import none of what went
    slim = " ".join(rest for w, rest in st["slim"] if w == "RUN")
    assert "pip uninstall -y torch" in slim and "assert not bad" in slim

    runtime = st["runtime"]
    copies = [rest for w, rest in runtime if w == "COPY"]
    assert "--from=slim /opt/venv /opt/venv" in copies and not any("--from=builder /opt/venv" in c for c in copies)
    user = [rest for w, rest in runtime if w == "USER"]
    assert len(user) == 1 and re.fullmatch(r"[1-9]\d*:[1-9]\d*", user[0])  # numeric, not root
    env = env_of(runtime)
    assert env["CROSSPROBE_HOST"] == "0.0.0.0"
    assert env["CROSSPROBE_MODELS_DIR"] == "/opt/crossprobe/graphs"
    assert any(c.endswith("/opt/crossprobe/graphs /opt/crossprobe/graphs") for c in copies)
    volumes = json.loads(next(rest for w, rest in runtime if w == "VOLUME"))
    assert volumes == [env["CROSSPROBE_INDEX_ROOT"]]
    assert [rest for w, rest in runtime if w == "EXPOSE"] == [env["CROSSPROBE_PORT"]]
    assert json.loads(next(rest for w, rest in runtime if w == "CMD")) == ["crossprobe", "serve"]
    health = next(rest for w, rest in runtime if w == "HEALTHCHECK")
    cmd = json.loads(health[health.index("CMD") + 3:])
    assert cmd[:2] == ["python", "-c"] and "/healthz" in cmd[2] and "urllib" in cmd[2]
    assert not any("curl" in r or "wget" in r for _, r in runtime)


def test_dockerignore_keeps_the_context_small_and_the_copied_files_in():
    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    for must in (".venv", "cache", "runs", "artifacts", "docs/research/results", "benchmarks", "research", ".git"):
        assert must in patterns, must

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)

    copied = []
    for word, rest in instructions():
        if word == "COPY" and "--from" not in rest:
            copied += rest.split()[:-1]
    assert copied
    for src in copied:
        assert (REPO / src).exists() and not ignored(src.rstrip("/")), src
    # package data the wheel must carry into the image: the committed checkpoint
    ckpt = "models/checkpoints/default/model.safetensors"
    assert (REPO / ckpt).is_file() and not ignored(ckpt)


def test_another_model_is_baked_in_by_a_build_argument_and_named_contexts():
    """MODEL (a spec) reaches the builder, which exports it into the graphs folder the runtime reads, and the runtime's
    CROSSPROBE_MODEL, which the service and the jobs read; its files come from the named context `model`, graphs
    exported elsewhere from `graphs`; both are empty scratch stages unless the build names such a context (buildah
    1.28 / podman 4.3 and BuildKit both copy an empty stage's root as nothing). The export runs only when MODEL is
    set, after the committed checkpoint's graphs (those stay: the default model serves without MODEL)."""
    instrs = instructions()
    st = stages(instrs)
    assert st["model"] == [] and st["graphs"] == []
    builder = st["builder"]
    assert ("ARG", "MODEL=") in builder and ("ARG", "MODEL=") in st["runtime"]  # declared where it is read
    at = {step: i for i, step in enumerate(builder)}
    model_copy = ("COPY", "--from=model / /opt/crossprobe/model/")
    graphs_copy = ("COPY", "--from=graphs / /opt/crossprobe/graphs/")
    export = next(i for i, (w, r) in enumerate(builder) if w == "RUN" and "crossprobe models export" in r)
    assert builder[export][1] == ('if [ -n "$MODEL" ]; then crossprobe models export "$MODEL" --out '
                                  '/opt/crossprobe/graphs; fi')
    own = next(i for i, (w, r) in enumerate(builder) if w == "RUN" and "crossprobe export --out" in r)
    assert own < at[model_copy] < export and at[graphs_copy] < export and at[("ARG", "MODEL=")] < export
    env = env_of(st["runtime"])
    assert env["CROSSPROBE_MODEL"] == "${MODEL}"
    assert env["CROSSPROBE_MODELS_DIR"] == "/opt/crossprobe/graphs"
    # an empty MODEL (the default build) is the committed checkpoint for both roles, as if unset
    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.core.inference.spec import ModelSpec
    from crossprobe.service.settings import Settings

    assert Settings(model="").model_spec == IndexerSettings(model="").model_spec == ModelSpec("crossprobe", "")
    assert Settings(model="hf:/opt/crossprobe/model").model_spec == ModelSpec("hf", "/opt/crossprobe/model")
    # the compose file passes the same argument (empty by default) to the image it builds
    compose = (REPO / "docker-compose.yml").read_text()
    assert "MODEL: ${MODEL:-}" in compose
