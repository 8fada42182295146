"""The error tree of common/errors.py: one root, and each dependency's failure on the side of the
retriable/permanent split that its callers act on."""

from __future__ import annotations

import pytest

from common.errors import GpulensError, PermanentError, RetriableError, UserError


@pytest.mark.parametrize(("module", "name", "branch"), [
    ("common.kafka", "BrokerUnavailable", RetriableError),
    ("common.settings", "ConfigError", UserError),
    ("sinks.clickhouse", "StoreUnavailable", RetriableError),
    ("sinks.clickhouse", "StoreRejected", PermanentError),
    ("sinks.readonly", "ReadOnlyViolation", PermanentError),
    ("producers.agent.source", "SourceUnavailable", RetriableError),
    ("producers.agent.nvml", "NvmlNotSupported", PermanentError),
    ("producers.watcher.informer", "Gone", RetriableError),
    ("producers.watcher.kube", "KubeConfigError", UserError),
    ("simulation.scenario", "ScenarioError", UserError),
    ("reports.analyses", "ClusterError", UserError),
])
def test_each_error_is_on_its_branch(module: str, name: str, branch: type[GpulensError]) -> None:
    import importlib

    error = getattr(importlib.import_module(module), name)
    assert issubclass(error, branch)
    assert not (issubclass(error, RetriableError) and issubclass(error, PermanentError)), f"{name} is on both sides"


def test_a_config_error_exits_2_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """ConfigError is a UserError: the CLI's one mapping prints it as one line, exit 2."""
    from gpulens.cli import main

    monkeypatch.setenv("GPULENS_LOG_LEVEL", "NOT-A-LEVEL")
    assert main(["config", "show"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpulens: invalid configuration: GPULENS_LOG_LEVEL") and "Traceback" not in err
