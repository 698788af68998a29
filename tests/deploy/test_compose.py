"""docker-compose.yml, read by the real docker-compose (`config` validates and interpolates it without an
engine), then checked against the repo: every bind-mounted file exists, every port and URL agrees with what
the service listening there uses (the Settings default or the env the file sets), every CROSSPROBE_* /
REDIS_URL variable is a field of the service's or the indexer's Settings (their pydantic-settings fields and
env names) and validates there, and every command line parses with the real `crossprobe` CLI."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.deploy.conftest import (DASHBOARD, DEPLOY, STACK_SECRETS, PROMETHEUS_YML, REPO, compose_config, load_yaml,
                                   run, tool)

# Where the upstream images listen unless their command / environment says otherwise (their documented
# defaults); the api's port comes from service/settings.py instead.
UPSTREAM_PORTS = {"redis": ("--port", 6379), "prometheus": ("--web.listen-address", 9090),
                  "pushgateway": ("--web.listen-address", 9091), "grafana": ("GF_SERVER_HTTP_PORT", 3000),
                  "milvus": ("PROXY_PORT", 19530), "milvus-etcd": ("-listen-client-urls", 2379),
                  "milvus-minio": ("--address", 9000)}
MILVUS_SERVICES = {"milvus", "milvus-etcd", "milvus-minio"}  # the milvus profile
REPLICAS = ("api", "api-2")  # the api replicas behind the proxy (x-crossprobe-api)
HAPROXY_CFG = DEPLOY / "haproxy" / "haproxy.cfg"
OWN_VARS = re.compile(r"^(CROSSPROBE_\w+|REDIS_URL)$")


@pytest.fixture(scope="module")
def images_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("user-images")  # what a user passes as IMAGES


@pytest.fixture(scope="module")
def cfg(images_dir) -> dict:
    """The batch profile's view of the file (every service), as docker-compose renders it."""
    p, out = compose_config({"IMAGES": str(images_dir), **STACK_SECRETS}, "--profile", "batch")
    assert p.returncode == 0 and out, p.stderr
    assert "WARNING" not in p.stderr, p.stderr  # e.g. a variable without a default
    return out


def test_docker_compose_config_validates_with_and_without_the_batch_profile(cfg):
    p, plain = compose_config(STACK_SECRETS)  # no IMAGES: its default applies
    assert p.returncode == 0 and plain, p.stderr
    assert "WARNING" not in p.stderr, p.stderr
    profiles = run([tool("docker-compose"), "-f", str(REPO / "docker-compose.yml"), "config", "--profiles"],
                   cwd=REPO, env={**os.environ, **STACK_SECRETS})
    assert profiles.returncode == 0 and sorted(profiles.stdout.split()) == ["batch", "milvus", "watch"], \
        profiles.stdout + profiles.stderr
    batch = {n for n, s in cfg["services"].items() if "batch" in s.get("profiles", [])}
    assert batch == {"indexer", "reindex"}
    assert {n for n, s in cfg["services"].items() if "watch" in s.get("profiles", [])} == {"watcher"}
    # docker-compose 1.29's `config` renders every service whatever --profile says: the profiles key decides
    assert {n for n, s in cfg["services"].items() if not s.get("profiles")} == \
        {"redis", *REPLICAS, "proxy", "prometheus", "pushgateway", "grafana"}
    assert set(cfg["services"]) == {"redis", *REPLICAS, "proxy", "indexer", "reindex", "watcher", "prometheus",
                                    "pushgateway", "grafana", *MILVUS_SERVICES}


def _binds(service: dict) -> list[tuple[str, str]]:
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):  # long syntax
            out.append((v["type"], v.get("source", ""), v["target"]))
            continue
        src, dst = v.split(":")[:2]
        out.append(("bind" if src.startswith(("/", ".")) else "volume", src, dst))
    return out


def test_every_mount_source_exists(cfg, images_dir):
    declared = set(cfg.get("volumes", {}))
    for name, svc in cfg["services"].items():
        for kind, src, dst in _binds(svc):
            if kind == "volume":
                assert src in declared, f"{name}: volume {src} not declared"
                continue
            if Path(src) == images_dir:  # the user's photos (IMAGES): read-only, never a repo path
                assert dst == "/images", (name, dst)
                continue
            path = Path(src)
            assert path.is_relative_to(REPO) and path.exists(), f"{name}: bind mount {src} missing from the repo"


def _haproxy() -> dict[str, list[str]]:
    """deploy/haproxy/haproxy.cfg: section header ("frontend web", "backend replicas", ...) -> its lines (comments
    and blank lines left out)."""
    sections: dict[str, list[str]] = {}
    current = ""
    for raw in HAPROXY_CFG.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not raw[0].isspace():
            current = " ".join(line.split())
            sections[current] = []
        else:
            sections[current].append(" ".join(line.split()))
    return sections


def _listen_ports(name: str, svc: dict) -> set[int]:
    if name == "proxy":  # every `bind :port` of its frontends
        return {int(ln.rsplit(":", 1)[1]) for lines in _haproxy().values() for ln in lines if ln.startswith("bind ")}
    return {_listen_port(name, svc)}


def _listen_port(name: str, svc: dict) -> int:
    env = svc.get("environment") or {}
    if name in (*REPLICAS, "indexer", "reindex"):
        from crossprobe.service.settings import Settings

        return int(env.get("CROSSPROBE_PORT", Settings.model_fields["port"].default))
    if name == "watcher":  # its /metrics
        from crossprobe.indexer.jobs.settings import IndexerSettings

        return int(env.get("CROSSPROBE_INDEX_WATCH_METRICS_PORT", IndexerSettings.model_fields["watch_metrics_port"].default))
    flag, default = UPSTREAM_PORTS[name]
    if flag in env:
        return int(env[flag])
    cmd = svc.get("command") or []
    cmd = cmd.split() if isinstance(cmd, str) else cmd
    for i, arg in enumerate(cmd):
        if arg.startswith(flag + "="):
            return int(arg.rsplit(":", 1)[-1])
        if arg == flag:
            return int(cmd[i + 1].rsplit(":", 1)[-1])
    return default


def test_every_port_and_url_matches_what_listens_there(cfg):
    services = cfg["services"]
    listen = {n: _listen_port(n, s) for n, s in services.items() if n != "proxy"}
    # the image's own default agrees with the Settings default (compose may leave CROSSPROBE_PORT out)
    from crossprobe.service.settings import Settings

    assert f"CROSSPROBE_PORT={Settings.model_fields['port'].default}" in (REPO / "Dockerfile").read_text()

    published: dict[str, set[int]] = {}
    for name, svc in services.items():
        for spec in svc.get("ports", []):
            assert isinstance(spec, str), spec  # docker-compose 1.29's config: "127.0.0.1:8001:8000/tcp"
            host, target = (int(x.split("/")[0]) for x in spec.split(":")[-2:])
            assert target in _listen_ports(name, svc), f"{name} publishes {spec} but listens on {_listen_ports(name, svc)}"
            published.setdefault(name, set()).add(host)
    # clients reach the proxy on 8000, the port the one api published before it had replicas (docs, tests, users)
    assert 8000 in published["proxy"], published
    assert all(published.get(r) for r in REPLICAS), published  # and each replica alone on a port of its own
    assert "redis" not in published  # Redis stays on the compose network

    def check_url(where: str, url: str, want_host: str) -> None:
        u = urlparse(url if "//" in url else f"//{url}")
        assert u.hostname == want_host and u.port == listen[want_host], f"{where}: {url} (listens on {listen[want_host]})"

    for name, svc in services.items():
        env = svc.get("environment") or {}
        if "REDIS_URL" in env:
            check_url(f"{name} REDIS_URL", env["REDIS_URL"], "redis")
        if "CROSSPROBE_MILVUS_URI" in env:
            check_url(f"{name} CROSSPROBE_MILVUS_URI", env["CROSSPROBE_MILVUS_URI"], "milvus")
        if "CROSSPROBE_PUSHGATEWAY_URL" in env:
            check_url(f"{name} CROSSPROBE_PUSHGATEWAY_URL", env["CROSSPROBE_PUSHGATEWAY_URL"], "pushgateway")
    jobs = {j["job_name"]: j for j in load_yaml(PROMETHEUS_YML)["scrape_configs"]}
    for job, host in (("pushgateway", "pushgateway"), ("crossprobe-watch", "watcher")):
        (target,) = [t for sc in jobs[job]["static_configs"] for t in sc["targets"]]
        check_url(f"prometheus.yml job {job}", target, host)
    # every replica scraped, by its service name (the Host its CROSSPROBE_ALLOWED_HOSTS accepts)
    targets = [t for sc in jobs["crossprobe-api"]["static_configs"] for t in sc["targets"]]
    assert sorted(urlparse(f"//{t}").hostname for t in targets) == sorted(REPLICAS), targets
    for target in targets:
        check_url("prometheus.yml job crossprobe-api", target, urlparse(f"//{target}").hostname)
    assert jobs["pushgateway"].get("honor_labels") is True  # keeps the pushed job / index labels
    (ds,) = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"]
    check_url("grafana datasource", ds["url"], "prometheus")


def _settings_env_names() -> dict[str, list[type]]:
    """Env variable -> the Settings classes that read it, from the pydantic-settings models themselves."""
    from pydantic import AliasChoices

    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.service.settings import Settings as ServiceSettings

    names: dict[str, list[type]] = {}
    for cls in (ServiceSettings, IndexerSettings):
        assert not cls.model_config.get("case_sensitive")  # env names compare upper-cased below
        prefix = cls.model_config.get("env_prefix", "")
        for field, info in cls.model_fields.items():
            alias = info.validation_alias
            if isinstance(alias, AliasChoices):  # pydantic-settings reads each string choice as an env name
                envs = [c for c in alias.choices if isinstance(c, str)]
            elif isinstance(alias, str):
                envs = [alias]
            else:
                envs = []
            if not envs or cls.model_config.get("populate_by_name"):  # then it reads <prefix><field> too
                envs.append(prefix + field)
            for e in envs:
                names.setdefault(e.upper(), []).append(cls)
    return names


def test_every_crossprobe_variable_is_a_settings_field_and_validates(cfg, monkeypatch):
    known = _settings_env_names()
    assert {"REDIS_URL", "CROSSPROBE_PORT", "CROSSPROBE_INDEX_ROOT"} <= set(known)  # the reading itself works
    seen = set()
    for name, svc in cfg["services"].items():
        env = {k: str(v) for k, v in (svc.get("environment") or {}).items() if OWN_VARS.match(k)}
        for var in env:
            assert var in known, f"{name}: {var} is not a field of the service's or the indexer's Settings"
        seen |= set(env)
        # the values parse where they are read (a port that is not a number, a bool that is not one...)
        for k in list(os.environ):
            if OWN_VARS.match(k):
                monkeypatch.delenv(k)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        for cls in {c for var in env for c in known[var]}:
            cls()
    assert {"REDIS_URL", "CROSSPROBE_PUSHGATEWAY_URL", "CROSSPROBE_INDEX_ROOT"} <= seen


def _parse_cli(argv: list[str]):
    """Resolve argv with the real `crossprobe` click tree and parse every option (types, choices, required)
    without running the command."""
    from typer.main import get_command

    from crossprobe.cli import app

    assert argv[0] == "crossprobe", argv
    cmd, name = get_command(app), "crossprobe"
    ctx = cmd.make_context(name, list(argv[1:]))
    while hasattr(cmd, "resolve_command"):  # a group (typer ships its own click: no isinstance on click's)
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        name, cmd, rest = cmd.resolve_command(ctx, rest)
        ctx = cmd.make_context(name, rest, parent=ctx)
    return name, ctx.params


def test_every_command_line_parses_with_the_cli(cfg):
    svcs = cfg["services"]
    assert "command" not in svcs["api"]  # the image's CMD: crossprobe serve
    cmd_line = next(line for line in (REPO / "Dockerfile").read_text().splitlines() if line.startswith("CMD "))
    assert _parse_cli(json.loads(cmd_line[4:]))[0] == "serve"
    name, params = _parse_cli(svcs["indexer"]["command"])
    assert name == "build" and params["name"] == "photos" and str(params["images"]) == "/images"
    name, params = _parse_cli(svcs["reindex"]["command"])
    assert name == "reindex" and params["all_"] is True


def test_services_are_wired_as_documented(cfg):
    s = cfg["services"]
    assert s["redis"]["image"].startswith("redis:")
    # $$: a literal $ for the shell in the container (compose would interpolate one)
    assert "--appendonly yes --requirepass \"$$REDIS_PASSWORD\"" in s["redis"]["command"][-1]
    assert "redis-cli" in s["redis"]["healthcheck"]["test"] and "ping" in s["redis"]["healthcheck"]["test"]
    assert any(dst == "/data" and kind == "volume" for kind, _, dst in _binds(s["redis"]))
    for name in (*REPLICAS, "indexer", "reindex"):
        assert s[name]["depends_on"]["redis"]["condition"] == "service_healthy", name
        assert s[name]["build"]["context"] == str(REPO) and s[name]["image"] == s["api"]["image"]
        from crossprobe.indexer.jobs.settings import IndexerSettings

        root = s[name]["environment"]["CROSSPROBE_INDEX_ROOT"]
        assert ("volume", "indexes", root) in _binds(s[name]), name  # one index volume, shared
        assert IndexerSettings.model_fields["index_root"].default != Path(root)  # i.e. the env really moves it
    assert s["indexer"]["environment"]["CROSSPROBE_PUSHGATEWAY_URL"] == \
        s["reindex"]["environment"]["CROSSPROBE_PUSHGATEWAY_URL"]
    assert s["pushgateway"]["image"].startswith("prom/pushgateway:")

    # prometheus: its config and rules files from deploy/prometheus/, where the config expects them
    prom = s["prometheus"]
    assert prom["image"].startswith("prom/prometheus:")
    mounts = {dst: Path(src) for kind, src, dst in _binds(prom) if kind == "bind"}
    config_path = next(a.split("=", 1)[1] for a in prom["command"] if a.startswith("--config.file="))
    assert mounts[config_path] == PROMETHEUS_YML
    for rule_file in load_yaml(PROMETHEUS_YML)["rule_files"]:
        inside = str(Path(config_path).parent / rule_file)
        assert mounts[inside] == PROMETHEUS_YML.parent / rule_file

    # grafana: provisioning and dashboards from deploy/grafana/, anonymous viewers, no clicks
    g = s["grafana"]
    assert g["image"].startswith("grafana/grafana")
    mounts = {dst: Path(src) for kind, src, dst in _binds(g) if kind == "bind"}
    assert mounts["/etc/grafana/provisioning"] == DEPLOY / "grafana/provisioning"
    (provider,) = load_yaml(DEPLOY / "grafana/provisioning/dashboards/crossprobe.yml")["providers"]
    dash_dir = provider["options"]["path"]
    assert mounts[dash_dir] == DASHBOARD.parent
    home = g["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert Path(home).parent == Path(dash_dir) and (DASHBOARD.parent / Path(home).name).is_file()
    assert g["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "true"
    assert g["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    (ds,) = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"]
    dash = json.loads(DASHBOARD.read_text())
    uids = {p["datasource"]["uid"] for p in dash["panels"] if "datasource" in p}
    uids |= {t["datasource"]["uid"] for p in dash["panels"] for t in p.get("targets", [])}
    assert uids == {ds["uid"]}


# Grafana's settings (GF_<SECTION>_<KEY>, Grafana 11's conf/defaults.ini) that send anything to grafana.com or
# elsewhere, each off: usage reports, update checks for Grafana and its plugins, the news feed, feedback links,
# snapshots published to Grafana's public server, Gravatar images
GRAFANA_QUIET = {"GF_ANALYTICS_REPORTING_ENABLED": "false", "GF_ANALYTICS_CHECK_FOR_UPDATES": "false",
                 "GF_ANALYTICS_CHECK_FOR_PLUGIN_UPDATES": "false", "GF_ANALYTICS_FEEDBACK_LINKS_ENABLED": "false",
                 "GF_NEWS_NEWS_FEED_ENABLED": "false", "GF_SNAPSHOTS_EXTERNAL_ENABLED": "false",
                 "GF_SECURITY_DISABLE_GRAVATAR": "true"}


def test_grafana_reports_nothing_and_its_admin_password_is_required(cfg, images_dir):
    """No admin/admin: without GRAFANA_ADMIN_PASSWORD (unset or empty) docker-compose refuses the file, saying which
    variable to set; with it, Grafana gets that password and every setting that would call out is off."""
    redis = {"REDIS_PASSWORD": STACK_SECRETS["REDIS_PASSWORD"]}
    for env in ({"IMAGES": str(images_dir), **redis}, {"IMAGES": str(images_dir), "GRAFANA_ADMIN_PASSWORD": "", **redis}):
        p, out = compose_config(env)
        assert p.returncode != 0 and out is None, p.stdout
        assert "set GRAFANA_ADMIN_PASSWORD, Grafana's admin password" in p.stderr, p.stderr
    g = cfg["services"]["grafana"]["environment"]
    assert g["GF_SECURITY_ADMIN_PASSWORD"] == STACK_SECRETS["GRAFANA_ADMIN_PASSWORD"]
    assert {k: g.get(k) for k in GRAFANA_QUIET} == GRAFANA_QUIET
    assert g["GF_USERS_ALLOW_SIGN_UP"] == "false" and g["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


def test_redis_needs_a_password_and_every_service_is_confined(cfg, images_dir):
    """Issue 55, item 7: Redis asks for REDIS_PASSWORD (compose refuses the file without it) and every crossprobe
    role reaches it with that password; every service drops all Linux capabilities (Redis keeps the few its
    entrypoint needs to become its user), may not gain privileges, and has memory and process limits; the api
    mounts the photos read-only (the indexes it must write: tantivy locks a keyword index to read it). `make
    test-deploy` checks the same on the running containers."""
    p, out = compose_config({"IMAGES": str(images_dir), "GRAFANA_ADMIN_PASSWORD": "x"})
    assert p.returncode != 0 and "set REDIS_PASSWORD" in p.stderr, p.stderr
    s = cfg["services"]
    pw = STACK_SECRETS["REDIS_PASSWORD"]
    assert s["redis"]["environment"]["REDIS_PASSWORD"] == pw == s["redis"]["environment"]["REDISCLI_AUTH"]
    for name in (*REPLICAS, "indexer", "reindex", "watcher"):
        assert s[name]["environment"]["REDIS_URL"] == f"redis://:{pw}@redis:6379/0", name
    for name, svc in s.items():
        if name.startswith("milvus"):
            continue  # the milvus profile's images run as they are published (docs/deployment.md)
        assert svc.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in svc.get("security_opt", []), name
        assert svc.get("mem_limit") and svc.get("pids_limit"), name
    assert set(s["redis"]["cap_add"]) <= {"SETUID", "SETGID", "CHOWN", "DAC_OVERRIDE"}
    # the Milvus profile's MinIO: credentials from the environment (none: it refuses to start, saying which), the
    # same pair given to Milvus, never the published minioadmin
    p, mil = compose_config({"IMAGES": str(images_dir), **STACK_SECRETS, "MILVUS_MINIO_PASSWORD": "a-minio-pass-0123"},
                            "--profile", "milvus")
    assert p.returncode == 0, p.stderr
    minio, milvus = mil["services"]["milvus-minio"], mil["services"]["milvus"]
    assert minio["environment"]["MINIO_ROOT_PASSWORD"] == milvus["environment"]["MINIO_SECRET_ACCESS_KEY"] == \
        "a-minio-pass-0123"
    assert minio["environment"]["MINIO_ROOT_USER"] == milvus["environment"]["MINIO_ACCESS_KEY_ID"]
    assert "minioadmin" not in json.dumps(mil) and "set MILVUS_MINIO_PASSWORD" in minio["command"][-1]
    def ro(v) -> bool:
        return v.get("read_only", False) if isinstance(v, dict) else v.endswith(":ro")

    def target(v) -> str:
        return v["target"] if isinstance(v, dict) else v.split(":")[1]

    for name in (*REPLICAS, "indexer", "reindex", "watcher"):  # the photos: read by every role, written by none
        assert all(ro(v) for v in s[name]["volumes"] if target(v) == "/images"), name
    assert all(ro(v) for v in s["prometheus"]["volumes"] if target(v).startswith("/etc/"))
    assert all(ro(v) for v in s["proxy"]["volumes"]) and s["proxy"].get("read_only") is True


def test_the_compose_runs_the_milvus_the_tests_run(images_dir):
    """The Milvus profile's server is the release `make test-milvus` runs (PyPI's `milvus` wheel)."""
    from benchmarks.support.local_milvus import SERVER_VERSION

    p, mil = compose_config({"IMAGES": str(images_dir), **STACK_SECRETS}, "--profile", "milvus")
    assert p.returncode == 0, p.stderr
    assert mil["services"]["milvus"]["image"] == f"milvusdb/milvus:v{SERVER_VERSION}"


def test_the_milvus_profile_runs_milvus_standalone_wired_to_the_service(images_dir, cfg):
    """--profile milvus adds Milvus standalone (its own etcd and minio, nothing published); the api and the batch
    jobs reach it at CROSSPROBE_MILVUS_URI, and CROSSPROBE_ANN_BACKEND (default faiss) selects it for new
    versions. Without the profile none of the three runs, and the default stays FAISS."""
    p, m = compose_config({"IMAGES": str(images_dir), "CROSSPROBE_ANN_BACKEND": "milvus", **STACK_SECRETS},
                          "--profile", "milvus",
                          "--profile", "batch")
    assert p.returncode == 0 and m, p.stderr
    assert "WARNING" not in p.stderr, p.stderr
    s = m["services"]
    assert MILVUS_SERVICES <= set(s)
    for name in MILVUS_SERVICES:
        assert s[name]["profiles"] == ["milvus"] and not s[name].get("ports"), name  # compose network only
    mil = s["milvus"]
    assert mil["image"].startswith("milvusdb/milvus:v2.") and mil["command"] == ["milvus", "run", "standalone"]
    assert {k: v["condition"] for k, v in mil["depends_on"].items()} == \
        {"milvus-etcd": "service_healthy", "milvus-minio": "service_healthy"}
    env = mil["environment"]
    etcd_port = int(next(a for a in s["milvus-etcd"]["command"] if a.startswith("-listen-client-urls="))
                    .rsplit(":", 1)[1])
    assert env["ETCD_ENDPOINTS"] == f"milvus-etcd:{etcd_port}" and env["MINIO_ADDRESS"] == "milvus-minio:9000"
    assert "exec minio server /minio_data " in s["milvus-minio"]["command"][-1]
    assert "http://localhost:9091/healthz" in mil["healthcheck"]["test"]  # Milvus' own health endpoint
    declared = set(m.get("volumes", {}))
    for name in MILVUS_SERVICES:
        assert {src for kind, src, _ in _binds(s[name]) if kind == "volume"} <= declared, name

    from crossprobe.indexer.jobs.settings import IndexerSettings
    from crossprobe.service.settings import Settings as ServiceSettings

    for name in (*REPLICAS, "indexer", "reindex"):
        e = s[name]["environment"]
        u = urlparse(e["CROSSPROBE_MILVUS_URI"])
        assert (u.scheme, u.hostname, u.port) == ("http", "milvus", 19530), name  # Milvus' gRPC port (its default)
        assert e["CROSSPROBE_ANN_BACKEND"] == "milvus", name
    assert cfg["services"]["indexer"]["environment"]["CROSSPROBE_ANN_BACKEND"] == "faiss"  # the default
    ixs = IndexerSettings(ann_backend=s["indexer"]["environment"]["CROSSPROBE_ANN_BACKEND"],
                        milvus_uri=s["indexer"]["environment"]["CROSSPROBE_MILVUS_URI"])
    assert ixs.ann_backend == "milvus" and ServiceSettings(milvus_uri=ixs.milvus_uri).milvus_uri == ixs.milvus_uri


def test_the_replicas_are_one_definition_behind_the_proxy(cfg):
    """api and api-2 differ in their published port alone (one anchor); the proxy is HAProxy with the repo's file
    where the official image reads it, started after them; each replica accepts the Host names it is reached by:
    the loopback names the proxy passes on from clients, and its own service name, which Prometheus sends."""
    s = cfg["services"]
    bare = [{k: v for k, v in s[r].items() if k != "ports"} for r in REPLICAS]
    assert all(b == bare[0] for b in bare), "the replicas differ beyond their ports: define them from x-crossprobe-api"
    proxy = s["proxy"]
    assert proxy["image"] == "haproxy:2.6"  # scripts/container-setup.sh builds the stand-in under this name
    mounts = {dst: Path(src) for kind, src, dst in _binds(proxy) if kind == "bind"}
    assert mounts == {"/usr/local/etc/haproxy/haproxy.cfg": HAPROXY_CFG}
    assert set(proxy["depends_on"]) == set(REPLICAS)
    for r in REPLICAS:
        hosts = set(s[r]["environment"]["CROSSPROBE_ALLOWED_HOSTS"].split(","))
        assert {"localhost", "127.0.0.1", r} <= hosts, (r, hosts)


def test_the_proxy_checks_every_replica_and_retries_only_what_reads(cfg):
    """deploy/haproxy/haproxy.cfg against the compose file and the service's own routes: both backends list every
    replica at the port it listens on (and nothing else), the ready one checks /readyz and the fallback /healthz;
    a request dropped mid-way is retried (empty-response) for GET/HEAD and exactly the service's POST routes that
    only read (every POST route but /admin/*), never for a write."""
    from fastapi.routing import APIRoute

    from crossprobe.service.app import ROUTERS

    h = _haproxy()
    port = _listen_port("api", cfg["services"]["api"])
    for backend, check in (("backend replicas", "/readyz"), ("backend replicas-live", "/healthz")):
        servers = sorted(ln.split()[1:3] for ln in h[backend] if ln.startswith("server "))
        assert servers == sorted([r, f"{r}:{port}"] for r in REPLICAS), (backend, servers)
        assert f"http-check send meth GET uri {check} ver HTTP/1.1 hdr Host localhost" in h[backend], backend
        assert "http-check expect status 200" in h[backend], backend
    defaults = h["defaults"]
    (server_opts,) = [ln for ln in defaults if ln.startswith("default-server ")]
    assert {"check", "resolvers", "compose"} <= set(server_opts.split()), server_opts  # names looked up again
    assert "retry-on conn-failure empty-response junk-response" in defaults
    assert "option redispatch 1" in defaults  # each retry on another replica
    web = h["frontend web"]
    assert "use_backend replicas-live if { nbsrv(replicas) eq 0 }" in web and "default_backend replicas" in web
    assert "http-request disable-l7-retry unless read_only or search_post search_path" in web
    assert "acl read_only method GET HEAD" in web and "acl search_post method POST" in web
    (acl,) = [ln for ln in web if ln.startswith("acl search_path path ")]
    posts = {r.path for router in ROUTERS for r in router.routes if isinstance(r, APIRoute) and "POST" in r.methods}
    reads = {p for p in posts if not p.startswith("/admin/")}
    assert reads and posts - reads, posts  # both kinds exist: the split below means something
    assert set(acl.split()[3:]) == reads, f"the proxy retries {acl.split()[3:]}, the service's read-only POSTs: {reads}"
