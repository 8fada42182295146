"""What docs/prometheus.md hands a platform team: the scrape config and example alert rules pass
the real promtool's checks, the ServiceMonitor selects the worker Services' metrics port and keeps
the exported pod labels, and the Prometheus dashboard asks only for series the workers export
(its queries run against a real Prometheus in tests/stream_jobs/test_prometheus_scrape.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from stream_jobs.fleet_metrics import METRICS
from tests.deploy.helpers import GRAFANA_DIR, K8S_DIR, manifests, of_kind

PROMETHEUS_DIR = K8S_DIR / "prometheus"
COMPONENT = K8S_DIR / "components" / "prometheus-servicemonitor"
DASHBOARD = GRAFANA_DIR / "dashboards" / "prometheus" / "gpulens-prometheus.json"


def _promtool(prometheus_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(prometheus_dir / "promtool"), *args], capture_output=True, text=True, timeout=60,
                          check=False)


def test_scrape_config_and_rules_pass_promtool(prometheus_dir: Path, tmp_path: Path) -> None:
    scrape = yaml.safe_load((PROMETHEUS_DIR / "scrape-config.yml").read_text())
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({**scrape, "rule_files": [str(PROMETHEUS_DIR / "gpulens-rules.yml")]}))
    checked = _promtool(prometheus_dir, "check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout, checked.stdout
    (job,) = scrape["scrape_configs"]
    assert job["honor_labels"] is True, "the exported pod/namespace labels must not become exported_*"


def test_rules_fail_promtool_when_broken(prometheus_dir: Path, tmp_path: Path) -> None:
    """The check above can fail: a rule with a PromQL typo is refused."""
    broken = tmp_path / "rules.yml"
    broken.write_text((PROMETHEUS_DIR / "gpulens-rules.yml").read_text().replace("< 5", "< < 5", 1))
    assert _promtool(prometheus_dir, "check", "rules", str(broken)).returncode != 0


def _rule_metric_names(expr: str) -> set[str]:
    return {name for name in re.findall(r"\b(DCGM_FI_[A-Z_]+|gpulens_[a-z_]+)\b", expr)}


def test_rules_and_dashboard_use_only_exported_series() -> None:
    exported = {m.name for m in METRICS} | {"gpulens_fleet_series", "gpulens_fleet_series_dropped_total"}
    rules = yaml.safe_load((PROMETHEUS_DIR / "gpulens-rules.yml").read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads(DASHBOARD.read_text())
    exprs += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = set().union(*(_rule_metric_names(e) for e in exprs))
    assert used and used <= exported, used - exported
    # every family the workers export is on the dashboard, apart from the window bookkeeping
    shown = used | {"DCGM_FI_DEV_FB_FREE", "gpulens_pod_gpu_window_end_timestamp_seconds",
                    "gpulens_pod_gpu_cost_usd_per_hour", "gpulens_pod_pending_gpus"}
    assert exported <= shown, exported - shown


def test_dashboard_chooses_its_prometheus_datasource() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    uids = set(re.findall(r'"uid": "([^"]*)"', json.dumps(dashboard["panels"])))
    assert uids == {"${datasource}"}, "hard-coded data source uid"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_servicemonitor_selects_the_worker_metrics_ports() -> None:
    component = yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())
    assert component["kind"] == "Component" and component["resources"] == ["servicemonitor.yaml"]
    monitor: dict[str, Any] = yaml.safe_load((COMPONENT / "servicemonitor.yaml").read_text())
    assert monitor["kind"] == "ServiceMonitor" and monitor["apiVersion"] == "monitoring.coreos.com/v1"
    spec = monitor["spec"]
    selector = spec["selector"]["matchLabels"]
    selected = [s for s in of_kind(manifests(), "Service")
                if s["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
                and selector.items() <= s["metadata"]["labels"].items()]
    assert sorted(s["metadata"]["name"] for s in selected) == ["gpulens-worker-cluster-metrics",
                                                               "gpulens-worker-node-metrics"]
    (endpoint,) = spec["endpoints"]
    assert endpoint["honorLabels"] is True
    for service in selected:
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_docs_show_the_files_as_they_are() -> None:
    docs = (K8S_DIR.parent.parent / "docs" / "prometheus.md").read_text()
    for path in (PROMETHEUS_DIR / "scrape-config.yml", PROMETHEUS_DIR / "gpulens-rules.yml"):
        assert path.read_text().strip() in docs, f"docs/prometheus.md shows an old {path.name}"
