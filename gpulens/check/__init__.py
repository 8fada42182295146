"""``gpulens check``: what is wrong with an installation, one line per check with its fix.

:mod:`gpulens.check.core` holds the result type, the thresholds and the context;
:data:`gpulens.check.registry.CHECKS` is the one declared list of checks (adding a check is a
function and a row there); the checks themselves are in :mod:`~gpulens.check.kafka_checks`,
:mod:`~gpulens.check.store_checks` and :mod:`~gpulens.check.kube_checks`.
"""
