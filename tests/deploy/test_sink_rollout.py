"""The sink's rollout: every sink of the old version stops before a sink of the new one starts
(``strategy: Recreate``), in the chart (with its defaults and with more replicas) and in the
kustomize base generated from it, so no old sink inserts windows while a new one's migration
back-fills a rollup from the raw rows (docs/sink.md "Migrations")."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy.helpers import K8S_DIR
from tests.deploy.test_helm import Helm, find, helm, template

__all__ = ["helm"]  # the module's Helm fixture, used here


def test_the_chart_replaces_every_sink_at_once(helm: Helm, tmp_path: Path) -> None:
    for values in (None, {"sink": {"replicas": 4}}):
        sink = find(template(helm, tmp_path, values), "Deployment", "gpulens-sink")
        assert sink["spec"]["strategy"] == {"type": "Recreate"}, values
    assert sink["spec"]["replicas"] == 4


def test_the_kustomize_base_replaces_every_sink_at_once() -> None:
    docs = [doc for doc in yaml.safe_load_all((K8S_DIR / "sink.yaml").read_text()) if doc]
    (sink,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    assert sink["metadata"]["name"] == "gpulens-sink"
    assert sink["spec"]["strategy"] == {"type": "Recreate"}
