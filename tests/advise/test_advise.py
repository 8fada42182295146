"""``gpulens advise`` over replayed fleets stored in ClickHouse through the sink's own write path.

The goldens (``scenarios/*.advise.json``) hold figures derived by hand in each scenario's comment;
the advisor's JSON must equal them (numbers to 1e-4, every listed row, in order). The other tests
change one threshold or the period and check the answer a person would derive for that change.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from common.settings import AdviseThresholds
from gpulens.cli import main
from reports.advise import per_gpu_text
from reports.packing import MigProfile, PodEvidence, first_fit_decreasing, mig_table, right_size
from sinks.clickhouse import open_store
from sinks.migrations import migrate
from tests.report.dom import parse
from tests.report.loader import store_scenarios

SCENARIOS = Path(__file__).parent / "scenarios"
GOLDENS = sorted(SCENARIOS.glob("*.advise.json"))
GIB = 1024**3


@pytest.fixture(scope="session")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    cache: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in cache:
            tmp = tmp_path_factory.mktemp(name)
            store_scenarios([SCENARIOS / f"{name}.yaml"], f"chdb://{tmp / 'clickhouse'}")
            cache[name] = tmp
        return cache[name]

    return make


def run_cli(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.setenv("GPULENS_CLICKHOUSE__URL", f"chdb://{data_dir / 'clickhouse'}")
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        status = main(["advise", "--data-dir", str(data_dir), *args])
    return status, out.getvalue(), err.getvalue()


def advise_json(data_dir: Path, *args: str) -> dict[str, Any]:
    status, out, err = run_cli(data_dir, "--json", *args)
    assert status == 0, err
    return orjson.loads(out)  # type: ignore[no-any-return]


def differences(actual: Any, expected: Any, path: str = "") -> list[str]:
    """Where ``actual`` differs from ``expected``: every key the expectation names, lists whole and in order."""
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{path}: expected an object, got {actual!r}"]
        return [d for key, want in expected.items()
                for d in (differences(actual[key], want, f"{path}.{key}") if key in actual
                          else [f"{path}.{key}: missing"])]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{path}: expected {len(expected)} rows, got {actual!r}"]
        return [d for i, (a, e) in enumerate(zip(actual, expected, strict=True))
                for d in differences(a, e, f"{path}[{i}]")]
    if isinstance(expected, float | int) and not isinstance(expected, bool) and isinstance(actual, float | int):
        return [] if abs(actual - expected) <= 1e-4 else [f"{path}: expected {expected}, got {actual}"]
    return [] if actual == expected else [f"{path}: expected {expected!r}, got {actual!r}"]


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda p: p.name.removesuffix(".advise.json"))
def test_advisor_equals_the_hand_derived_golden(golden: Path, stored: Callable[[str], Path]) -> None:
    spec = orjson.loads(golden.read_bytes())
    advice = advise_json(stored(golden.name.removesuffix(".advise.json")), *spec["args"])
    problems = differences(advice, spec["expected"])
    assert problems == [], "\n".join(problems)


def test_goldens_cover_every_category() -> None:
    names = {p.name.removesuffix(".advise.json") for p in GOLDENS}
    assert names == {"advise-fleet", "advise-fragmentation"}
    for golden in GOLDENS:
        assert (SCENARIOS / golden.name.replace(".advise.json", ".yaml")).exists()


def test_no_gpu_hour_is_counted_twice_and_totals_reconcile(stored: Callable[[str], Path]) -> None:
    for name, args in (("advise-fleet", ()), ("advise-fleet", ("--idle-stretch", "30m", "--bucket", "10m")),
                       ("advise-fragmentation", ("--min-evidence", "10m"))):
        advice = advise_json(stored(name), *args)
        t = advice["totals"]
        assert t["capacity_gpu_hours"] == pytest.approx(t["held_gpu_hours"] + t["unallocated_gpu_hours"], abs=1e-3)
        from_pods = t["reclaim_gpu_hours"] + t["right_size_gpu_hours"] + t["pack_gpu_hours"]
        assert from_pods <= t["held_gpu_hours"] + 1e-6
        assert t["scale_to_zero_gpu_hours"] <= t["unallocated_gpu_hours"] + 1e-6
        assert t["reclaimable_gpu_hours"] == pytest.approx(from_pods + t["scale_to_zero_gpu_hours"], abs=1e-6)
        assert t["kept_gpu_hours"] == pytest.approx(t["capacity_gpu_hours"] - t["reclaimable_gpu_hours"], abs=1e-6)
        if name == "advise-fragmentation":  # no prices: every money figure is unknown, never $0
            assert t["capacity_cost_usd"] is None and t["reclaimable_cost_usd"] is None
        else:
            assert t["reclaimable_cost_usd"] <= t["capacity_cost_usd"] + 1e-6
        # each list adds up to its category's total
        assert sum(r["gpu_hours"] for r in advice["reclaim"]) == pytest.approx(t["reclaim_gpu_hours"], abs=1e-6)
        assert sum(r["freed_gpu_hours"] for r in advice["pack"]) == pytest.approx(t["pack_gpu_hours"], abs=1e-6)
        # a pod in reclaim is never also freed by right-size in the same GPU-hours: per pool, what pack
        # and right-size free is what the non-reclaimed pods held minus what the bins needed
        for pool in advice["pack"]:
            assert pool["freed_gpu_hours"] == pytest.approx(
                max(0.0, pool["held_gpu_hours"] - pool["right_size_gpu_hours"] - pool["needed_gpu_hours"]), abs=1e-6)
        reclaimed = sum(r["gpu_hours"] for r in advice["reclaim"])
        pack_held = sum(p["held_gpu_hours"] for p in advice["pack"])
        assert reclaimed + pack_held == pytest.approx(t["held_gpu_hours"], abs=1e-6)


def test_since_counts_back_from_the_latest_data_not_the_wall_clock(stored: Callable[[str], Path]) -> None:
    # The data ends 2026-01-05 12:00. --since 1h is 11:00-12:00: the notebook's 11:00 bucket (1 h idle run)
    # -> 1; train-big 6 spare GPUs x 1 h -> 6 (1 h evidence = the minimum); infer 3 -> 1 GPU -> 2; gpu-c 8.
    advice = advise_json(stored("advise-fleet"), "--since", "1h")
    assert advice["period"]["start"] == "2026-01-05T11:00:00.000Z"
    t = advice["totals"]
    assert (t["capacity_gpu_hours"], t["held_gpu_hours"]) == pytest.approx((24.0, 12.0))
    assert (t["reclaim_gpu_hours"], t["right_size_gpu_hours"], t["pack_gpu_hours"], t["scale_to_zero_gpu_hours"]) \
        == pytest.approx((1.0, 6.0, 2.0, 8.0))
    assert advice["headline"]["gpus"] == pytest.approx(17.0)
    # a period longer than any date (past what a time can hold) is the whole history, from 1970
    whole = advise_json(stored("advise-fleet"), "--since", "99999999999d")
    assert whole["period"]["start"] == "1970-01-01T00:00:00.000Z"
    assert whole["totals"] == advise_json(stored("advise-fleet"), "--since", "3650d")["totals"]


def test_a_shorter_idle_run_than_the_threshold_is_not_reclaimed_but_packed(stored: Callable[[str], Path]) -> None:
    # The notebook idles 2 h; asking for 3 h runs leaves it a whole-GPU pod in every bucket: serve pool
    # held 12, needed 1 (notebook) + 1 (3 x 1/7) per hour = 6 -> pack still frees 6, reclaim 0.
    advice = advise_json(stored("advise-fleet"), "--idle-stretch", "3h")
    assert advice["reclaim"] == []
    serve = next(p for p in advice["pack"] if p["pool"].startswith("serve"))
    assert (serve["held_gpu_hours"], serve["needed_gpu_hours"], serve["freed_gpu_hours"]) == pytest.approx((12, 6, 6))
    assert advice["totals"]["reclaimable_gpu_hours"] == pytest.approx(48.0)


def test_headroom_chooses_the_next_mig_profile(stored: Callable[[str], Path]) -> None:
    # 8 GiB x 1.3 = 10.4 GiB > 10 GiB: 1g.20gb (1 of 7 compute slices, 2 of 8 memory slices = 1/4 of a
    # GPU when packed); 3 x 1/4 still fit one GPU, so pack is unchanged.
    advice = advise_json(stored("advise-fleet"), "--headroom", "30")
    infer = [r for r in advice["right_size"] if r["pod"].startswith("infer")]
    assert {r["recommendation"] for r in infer} == {"MIG 1g.20gb instead of a whole GPU"}
    assert {r["unit_gpus"] for r in infer} == {0.25}
    assert advice["totals"]["pack_gpu_hours"] == pytest.approx(6.0)


def test_too_little_evidence_gives_no_right_size(stored: Callable[[str], Path]) -> None:
    advice = advise_json(stored("advise-fleet"), "--min-evidence", "4h")
    assert advice["right_size"] == [] and advice["scale_to_zero"] == []
    # no right-size: every pod keeps what it holds, only the notebook's idle hours are reclaimable
    assert advice["totals"]["reclaimable_gpu_hours"] == pytest.approx(2.0)


def test_team_filter_keeps_only_the_teams_pods(stored: Callable[[str], Path]) -> None:
    advice = advise_json(stored("advise-fleet"), "--team", "search")
    assert {r["pod"] for r in advice["right_size"]} == {"infer-1", "infer-2", "infer-3"}
    assert advice["reclaim"] == [] and advice["scale_to_zero"] == []
    assert advice["totals"]["held_gpu_hours"] == pytest.approx(9.0)
    # 3 GPUs held, 1 serves: 2 GPUs, 67 % of the team's GPUs, $5/h -> $3,600/month
    assert advice["headline"]["gpus"] == pytest.approx(2.0)
    assert advice["headline_text"] == "2.0 GPUs (67 % of team search's GPUs) reclaimable, $3,600/month"


def test_text_output_leads_with_the_headline_and_names_the_pods(stored: Callable[[str], Path]) -> None:
    status, out, _ = run_cli(stored("advise-fleet"))
    assert status == 0
    lines = out.splitlines()
    assert lines[0] == "16.7 GPUs (69 %) reclaimable, $30,000/month"
    assert lines[1].startswith("you held 12.0 GPUs, 3.3 would have served the same work: 8.7 GPUs (72 %)")
    for name in ("notebook-bob", "train-big", "infer-1", "gpu-c", "2 GPUs instead of 8", "MIG 1g.10gb"):
        assert name in out
    # right-size rows name each GPU by index with its percentile: train-big computes on GPUs 0 and 1
    train = next(line for line in lines if "train-big" in line and "instead of 8" in line)
    assert "GPU 0-1: 90 %, GPU 2-7: 0 %" in train


@pytest.mark.parametrize(("args", "env", "names"), [
    (("--since", "banana"), {}, "--since"),
    (("--since", "0s"), {}, "--since"),
    (("--percentile", "0"), {}, "--percentile"),
    (("--bucket", "10s"), {}, "--bucket"),
    ((), {"GPULENS_ADVISE__HEADROOM_PCT": "-5"}, "GPULENS_ADVISE__HEADROOM_PCT"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], env: dict[str, str], names: str,
                                          tmp_path: Path) -> None:
    status, out, err = run_cli(tmp_path, *args, env=env)
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and names in err, err


def test_an_empty_store_says_so(tmp_path: Path) -> None:
    store = open_store(f"chdb://{tmp_path / 'clickhouse'}")
    try:
        migrate(store)
    finally:
        store.close()
    status, out, _ = run_cli(tmp_path)
    assert status == 0 and out.strip() == "no data in the store: nothing to advise"


def test_per_gpu_text_joins_runs_of_the_same_figure() -> None:
    def gpu(index: int | None, pct: float | None, uuid: str = "GPU-x") -> dict[str, Any]:
        return {"gpu_index": index, "gpu_uuid": uuid, "percentile_sm_pct": pct}

    assert per_gpu_text([gpu(0, 90), gpu(1, 90), gpu(2, 0), gpu(3, 0)]) == "GPU 0-1: 90 %, GPU 2-3: 0 %"
    assert per_gpu_text([gpu(0, 10)]) == "GPU 0: 10 %"
    assert per_gpu_text([gpu(0, 0), gpu(2, 0), gpu(3, None)]) == "GPU 0: 0 %, GPU 2: 0 %, GPU 3: -"
    assert per_gpu_text([gpu(None, 5, "GPU-abc")]) == "GPU-abc: 5 %"


def test_mig_table_names_profiles_per_model() -> None:
    names = [p.name for p in mig_table("NVIDIA H100 80GB HBM3", 80 * GIB)]
    assert names == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    assert [p.name for p in mig_table("NVIDIA A100-SXM4-40GB", 40 * GIB)][:3] == ["1g.5gb", "1g.10gb", "2g.10gb"]
    assert [p.name for p in mig_table("NVIDIA H200", 141 * GIB)][::2] == ["1g.18gb", "2g.35gb", "4g.71gb"]
    assert [p.name for p in mig_table("NVIDIA A30", 24 * GIB)] == ["1g.6gb", "2g.12gb", "4g.24gb"]
    assert mig_table("NVIDIA L4", 24 * GIB) == []
    assert MigProfile("3g.40gb", 3, 4, 7, 8).gpu_fraction == 0.5


def test_first_fit_decreasing_packs_largest_first() -> None:
    bins = first_fit_decreasing([(0.25, 60, "a"), (0.5, 120, "b"), (0.5, 30, "c"), (0.25, 60, "d"), (0.25, 10, "e")])
    # decreasing: b .5, c .5 -> bin 1 full; a .25, d .25, e .25 -> bin 2
    assert [(used, seconds, pods) for used, seconds, pods in bins] == [
        (1.0, 120, ["b", "c"]), (0.75, 60, ["a", "d", "e"])]


def test_reports_show_the_advisor_with_the_pods_behind_it(stored: Callable[[str], Path]) -> None:
    data_dir = stored("advise-fleet")
    advice = advise_json(data_dir)
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("GPULENS_CLICKHOUSE__URL", f"chdb://{data_dir / 'clickhouse'}")
        assert main(["report", "--json", "--section", "reclaimable_capacity", "--data-dir", str(data_dir)]) == 0
        assert main(["report", "--html", str(data_dir / "report.html"), "--data-dir", str(data_dir)]) == 0
    rows = orjson.loads(out.getvalue().split("\nHTML report written")[0])["reclaimable_capacity"]
    assert rows[0]["category"] == "total" and rows[0]["gpu_hours"] == pytest.approx(50.0)
    assert rows[0]["detail"].startswith(advice["headline_text"])
    train = next(r for r in rows if r["subject"] == "research/train-big")
    assert "2 GPUs instead of 8 (p95 SM GPU 0-1: 90 %, GPU 2-7: 0 %; peak VRAM 60.0 GiB;" in train["detail"]
    listed = {(r["category"], r["subject"]): r["gpu_hours"] for r in rows[1:]}
    assert listed == pytest.approx({
        ("reclaim", "research/notebook-bob"): 2.0, ("scale_to_zero", "gpu-c"): 24.0,
        ("right_size", "research/train-big"): 18.0, ("right_size", "serving/infer-1"): 0.0,
        ("right_size", "serving/infer-2"): 0.0, ("right_size", "serving/infer-3"): 0.0,
        ("pack", "serve (NVIDIA H100 80GB HBM3)"): 6.0, ("pack", "train (NVIDIA H100 80GB HBM3)"): 0.0})
    page = parse((data_dir / "report.html").read_text(encoding="utf-8"))
    assert "reclaimable" in page.sections
    assert page.kpis["Reclaimable"] == "16.7 GPUs" and page.kpis["Per month"] == "$30,000.00"
    records = page.records("reclaimable")
    assert [(r["category"], r["pod / node / pool"]) for r in records] == [("total", "fleet"), *listed]
    assert "16.7 GPUs (69 %) reclaimable, $30,000/month" in page.text


def _evidence(model: str, mem_gib: float, peak_gib: list[float], sm: list[float | None], active_h: float = 2.0,
              gang: str = "") -> PodEvidence:
    return PodEvidence(pod_uid="u", namespace="ns", pod="p", team="t", project="p", node="n", pool="pool",
                       gpu_model=model, owner="", gang=gang, gpus=len(sm), share=1.0,
                       gpu_memory_bytes=mem_gib * GIB, usd_per_gpu_hour=1.0, active_s=active_h * 3600,
                       active_windows=int(active_h * 60), sm_pct=sm, peak_mem_bytes=[int(g * GIB) for g in peak_gib])


def test_right_size_rules() -> None:
    cfg = AdviseThresholds()
    # no MIG on an L4: the larger of 4 GiB x 1.2 / 24 GiB = 0.2 and 20 % x 1.2 = 0.24, rounded up to 5 %
    share = right_size(_evidence("NVIDIA L4", 24, [4], [20]), cfg)
    assert share is not None and share.kind == "time_slice" and share.demand.fraction == 0.25
    assert share.recommendation == "a 25% time-sliced share instead of 100% of a GPU"
    # 50 GiB x 1.2 = 60 GiB needs the whole 80 GiB GPU: nothing smaller
    assert right_size(_evidence("NVIDIA H100 80GB HBM3", 80, [50], [30]), cfg) is None
    # SM 70 % x 1.2 = 84 % needs 7 of 7 compute slices even for 8 GiB
    assert right_size(_evidence("NVIDIA H100 80GB HBM3", 80, [8], [70]), cfg) is None
    # too little evidence, a gang member, an SM-less (MIG) reading: no advice
    assert right_size(_evidence("NVIDIA H100 80GB HBM3", 80, [8], [10], active_h=0.5), cfg) is None
    assert right_size(_evidence("NVIDIA H100 80GB HBM3", 80, [8, 8], [10, 0], gang="g"), cfg) is None
    assert right_size(_evidence("NVIDIA H100 80GB HBM3", 80, [8], [None]), cfg) is None
    # a GPU holding VRAM counts as used even at 0 % SM; every GPU used -> keep them all
    assert right_size(_evidence("NVIDIA H100 80GB HBM3", 80, [8, 8], [90, 0]), cfg) is None
    fewer = right_size(_evidence("NVIDIA H100 80GB HBM3", 80, [8, 0, 0], [90, 0, 4]), cfg)
    assert fewer is not None and (fewer.kind, fewer.demand.whole_gpus, fewer.confidence) == ("fewer_gpus", 1, "medium")


def test_a_store_shorter_than_the_evidence_asked_says_so_instead_of_zero(stored: Callable[[str], Path]) -> None:
    advice = advise_json(stored("advise-fleet"), "--min-evidence", "24h", "--idle-stretch", "24h")
    assert advice["totals"]["reclaimable_gpu_hours"] == 0
    text = advice["headline_text"]
    assert re.fullmatch(r"not enough history yet: the longest pod history is (\d+) min, the advisor needs 1440 min "
                        r"of evidence \(--min-evidence\) before it names reclaimable GPUs", text), text
    # the fleet's pods ran for hours, not a day
    assert 60 <= int(text.split("is ")[1].split(" min")[0]) < 1440
    # with the evidence the data can give, the same store names figures, not this line
    assert advise_json(stored("advise-fleet"))["headline_text"].endswith("/month")
