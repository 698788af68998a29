"""docs/configuration.md's settings tables are generated from the Settings classes
(scripts/settings_table.py) and must match them."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from pydantic import Field, ValidationError

ROOT = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("settings_table", ROOT / "scripts" / "settings_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


st = _load_script()

from crossprobe.indexer.jobs.settings import IndexerSettings  # noqa: E402
from crossprobe.service.settings import Settings as ServiceSettings  # noqa: E402


class ServiceSettingsPlusOne(ServiceSettings):
    """The service's Settings with one field more, as a colleague would add it."""

    new_knob_s: float = Field(7.5, ge=0)  # a brand-new knob: seconds to wait for something


def test_configuration_doc_is_current():
    assert st.CONFIG_DOC == ROOT / "docs" / "configuration.md"
    diff = st.check(st.CONFIG_DOC)
    assert not diff, (f"docs/configuration.md's settings tables are stale: run `{st.WRITE_HINT}`\n" + diff)


def test_discovery_finds_every_settings_class():
    names = {f"{c.__module__}.{c.__qualname__}" for c in st.discover()}
    assert {"crossprobe.service.settings.Settings", "crossprobe.indexer.jobs.settings.IndexerSettings"} <= names


def test_a_new_field_makes_the_table_stale(tmp_path):
    """The check is real: one field more changes the rendered table, with its variable, default and comment,
    and a document with the old table then fails the check with a diff."""
    before = st.render([ServiceSettings])
    after = st.render([ServiceSettingsPlusOne])
    assert before != after
    assert "CROSSPROBE_NEW_KNOB_S" not in before
    row = next(line for line in after.splitlines() if "`CROSSPROBE_NEW_KNOB_S`" in line)
    assert "`7.5`" in row and "number, >= 0" in row and "a brand-new knob: seconds to wait for something" in row

    doc = tmp_path / "configuration.md"
    doc.write_text(f"# x\n\n## Settings\n\n{st.block([ServiceSettings])}\n", encoding="utf-8")
    assert st.check(doc, [ServiceSettings]) == ""
    diff = st.check(doc, [ServiceSettingsPlusOne])
    assert "+| `CROSSPROBE_NEW_KNOB_S`" in diff


def test_rows_use_the_names_pydantic_settings_reads():
    table = st.render([ServiceSettings, IndexerSettings])
    assert "| `REDIS_URL`, `CROSSPROBE_REDIS_URL` |" in table  # validation alias first, then the prefixed name
    assert "| `REDIS_URL`, `CROSSPROBE_INDEX_REDIS_URL` |" in table
    assert "| `CROSSPROBE_INDEX_ROOT` | path | `indexes` |" in table
    # description from the comment on the field's line, and from the comment block above it
    assert "uvicorn's per-request log line" in table
    assert "one ONNX Runtime thread pool shared by all graphs" in table


@pytest.mark.parametrize("cls", [ServiceSettings, IndexerSettings], ids=["service", "indexer"])
def test_each_variable_and_default_round_trips(cls, monkeypatch):
    """Every variable the table names is read by the class, and a default written as the table writes it
    parses back to the same value."""
    names = {n: st.env_names(cls, n) for n in cls.model_fields}
    for env in {e for envs in names.values() for e in envs}:
        monkeypatch.delenv(env, raising=False)
    for name, envs in names.items():
        field = cls.model_fields[name]
        value = st.default_value(field, cls, name)
        for env in envs:
            if value is not None:
                monkeypatch.setenv(env, value)
                got = cls()
                assert getattr(got, name) == cls.default_of(name), f"{env}={value!r} gives {getattr(got, name)!r}"
            else:  # unset by default: any valid value shows the variable is read (the Redis TLS and password
                # files: an existing file, beside a rediss:// REDIS_URL and the other half of a client certificate)
                tls = {"REDIS_URL": "rediss://x:1", "CROSSPROBE_REDIS_CERT_FILE": __file__,
                       "CROSSPROBE_REDIS_KEY_FILE": __file__}
                tls = {k: v for k, v in tls.items() if k not in envs}
                tries = [(c, beside) for beside in ({}, tls)
                         for c in ("1", "0.5", "x", "http://x", "redis://x:1", __file__)]
                for candidate, beside in tries:
                    for k, v in {**beside, env: candidate}.items():
                        monkeypatch.setenv(k, v)
                    try:
                        got = cls()
                        break
                    except ValidationError:
                        continue
                    finally:
                        for k in beside:
                            monkeypatch.delenv(k)
                else:
                    pytest.fail(f"no test value for {env}")
            assert name in got.model_fields_set, f"{env} is not read"
            monkeypatch.delenv(env)
