"""deploy/prometheus/ checked by Prometheus' own promtool: the config (with its rule file) and the rules are
valid, and every alert fires on the series that should fire it (promtool's rule unit tests, rules_test.yml).
Plus what the dashboard must show (the live test runs its queries)."""
from __future__ import annotations

import json
import re
from pathlib import Path

from tests.deploy.conftest import DASHBOARD, PROMETHEUS_YML, RULES, load_yaml, run, tool

UNIT_TESTS = Path(__file__).with_name("rules_test.yml")


def test_promtool_check_config():
    p = run([tool("promtool"), "check", "config", str(PROMETHEUS_YML)])
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
    assert "rules.yml" in p.stdout  # the rule file was found and checked too


def test_promtool_check_rules():
    p = run([tool("promtool"), "check", "rules", str(RULES)])
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
    assert "WARNING" not in p.stdout + p.stderr


def test_every_alert_fires_when_it_should():
    p = run([tool("promtool"), "test", "rules", str(UNIT_TESTS)])
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
    tested = set(re.findall(r"alertname: (\w+)", UNIT_TESTS.read_text()))
    alerts = {r["alert"] for g in load_yaml(RULES)["groups"] for r in g["rules"] if "alert" in r}
    assert alerts == tested, f"alerts without a unit test: {alerts - tested}"


def test_the_budget_is_written_once():
    text = RULES.read_text()
    (budget,) = [r for g in load_yaml(RULES)["groups"] for r in g["rules"]
                 if r.get("record") == "crossprobe:search_p99_budget_seconds"]
    value = re.fullmatch(r"vector\(([\d.]+)\)", budget["expr"]).group(1)
    assert text.count(value) == 1  # the alert and the dashboard read the recorded series, never the number
    assert value not in DASHBOARD.read_text()


def test_dashboard_shows_what_issue_15_asks():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["title"] == "crossprobe latency"
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for stage in ("queue", "encode", "ann", "fetch", "rerank", "metadata"):
        for q in ("0.5", "0.95", "0.99"):
            want = (f"histogram_quantile({q}, sum by (le, rerank) (rate(crossprobe_search_stage_seconds_bucket"
                    f"{{stage=\"{stage}\"}}")
            assert any(e.startswith(want) for e in exprs), (stage, q)
    for q in ("0.5", "0.95", "0.99"):
        assert any(e.startswith(f"histogram_quantile({q}, sum by (le, rerank) (rate(crossprobe_search_seconds_bucket")
                   for e in exprs)
    for metric in ("crossprobe_requests_total", "crossprobe_errors_total", "crossprobe_degraded_answers_total",
                   "crossprobe_index_items", "crossprobe_index_version_info", "crossprobe_batch_items_done",
                   "crossprobe_batch_items_total", "crossprobe_batch_images_per_second",
                   "crossprobe_batch_last_success_timestamp_seconds", "crossprobe_batch_failed",
                   "crossprobe_batch_running", "crossprobe_batch_skipped", "crossprobe_batch_duration_seconds"):
        assert any(metric in e for e in exprs), metric
    assert any('status="429"' in e for e in exprs) and any("by (status)" in e for e in exprs)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
