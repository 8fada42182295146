"""A query's result comes back as plain, JSON-friendly values, whatever the column's type: what
``gpulens sql``, the read API, the report and the advisor show and serialise."""

from __future__ import annotations

import json
import math

from sinks.clickhouse import ClickHouseStore

VALUES = """
SELECT toFloat64(1.5) AS f, nan AS f_nan, inf AS f_inf, -inf AS f_minus_inf, toFloat32(0.25) AS f32,
       CAST(NULL AS Nullable(Float64)) AS f_null, [1.5, nan, -inf] AS f_array,
       toInt64(-3) AS i, toUInt64(18446744073709551615) AS u,
       toInt128('-170141183460469231731687303715884105728') AS i128,
       true AS b, 'pod-a' AS s, unhex('FF00') AS s_bytes, toLowCardinality('team-x') AS lc,
       CAST(NULL AS Nullable(String)) AS s_null, toDecimal64(2.5, 3) AS d,
       toDateTime64('2026-12-06 10:11:12.345', 3, 'UTC') AS ts, toDate('2026-12-06') AS day,
       toUUID('092f82a7-ae88-59cc-8433-bc864c9cbfdb') AS id, toIPv4('10.0.0.1') AS ip4,
       map('a', nan, 'b', 2.0) AS m, (1, 'x', inf) AS t
"""

EXPECTED = {
    "f": 1.5, "f_nan": None, "f_inf": None, "f_minus_inf": None, "f32": 0.25, "f_null": None,
    "f_array": [1.5, None, None], "i": -3, "u": 18446744073709551615, "i128": -2 ** 127, "b": True,
    "s": "pod-a", "s_bytes": "ff00", "lc": "team-x", "s_null": None, "d": 2.5,
    "ts": "2026-12-06T10:11:12.345000Z", "day": "2026-12-06", "id": "092f82a7-ae88-59cc-8433-bc864c9cbfdb",
    "ip4": "10.0.0.1", "m": {"a": None, "b": 2.0}, "t": [1, "x", None],
}


def test_every_type_comes_back_json_friendly_with_non_finite_floats_as_null(store: ClickHouseStore) -> None:
    (row,) = store.query(VALUES).dicts()
    assert row == EXPECTED
    assert all(type(row[k]) is type(v) for k, v in EXPECTED.items())
    json.dumps(row, allow_nan=False)


def test_a_column_of_many_rows_mixes_plain_and_converted_values_in_order(store: ClickHouseStore) -> None:
    rows = store.query("""
SELECT number AS n, if(number % 3 = 0, nan, number / 2) AS f, if(number % 5 = 0, NULL, toString(number)) AS s,
       if(number % 7 = 0, unhex('FF'), 'ok') AS raw
FROM numbers(10000)""").rows
    assert len(rows) == 10000
    for n, f, s, raw in rows:
        assert f is None if n % 3 == 0 else (f == n / 2 and math.isfinite(f))
        assert s == (None if n % 5 == 0 else str(n))
        assert raw == ("ff" if n % 7 == 0 else "ok")
    assert [r[0] for r in rows] == list(range(10000))
