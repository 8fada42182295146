"""``python -m benchmarks history``: the history side at fleet scale.

:mod:`benchmarks.history.fill` fills a store with N days of an M-GPU fleet: simulated days played
through the real stages and the sink's write path, then extended in the engine (``INSERT ...
SELECT``) to the fleet's size and the history's length. :mod:`benchmarks.history.measure` measures
what the product asks of that store (report, advise, the Grafana panels, the SQL cookbook) from the
engine's own ``system.query_log``. :mod:`benchmarks.history.main` is the command.
"""
