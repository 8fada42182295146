"""The real NVML adapter is covered by tests that load the fake library through pynvml: nvml.py at
>= 90 % from tests/agent/test_nvml_library.py alone (the FakeNvml used elsewhere replaces the very
code that runs on a GPU node, so it must not count)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT

MINIMUM_PCT = 90.0


def test_nvml_adapter_coverage_from_the_fake_library_tests(tmp_path: Path) -> None:
    report = tmp_path / "coverage.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/agent/test_nvml_library.py", "-q", "-p", "no:cacheprovider",
         "--cov=producers.agent.nvml", f"--cov-report=json:{report}", "--cov-report=term-missing"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False,
        env=os.environ | {"COVERAGE_FILE": str(tmp_path / ".coverage")})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    files = json.loads(report.read_text())["files"]
    (summary,) = [f["summary"] for name, f in files.items() if name.endswith("producers/agent/nvml.py")]
    assert summary["percent_covered"] >= MINIMUM_PCT, result.stdout[-2000:]
