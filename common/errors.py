"""The root of gpulens' own errors and the one split that matters to a caller: will trying again
help?

- :class:`RetriableError`: a dependency is down or busy (broker, ClickHouse, kubelet, API server);
  the same call may succeed later, so loops back off and retry.
- :class:`PermanentError`: the input or the configuration is wrong; retrying the same thing fails
  the same way, so the record goes to the dead letters or the command stops.
- :class:`UserError`: a permanent error the user can fix (a bad flag, a missing tool, an
  unreachable dependency named in the message); the CLI prints it as one line and exits 2.

Only ``gpulens/cli.py`` turns errors into exit codes.
"""


class GpulensError(Exception):
    """Every error gpulens raises on purpose derives from this one."""


class RetriableError(GpulensError):
    """Transient: the same call may succeed later (a dependency is down, busy or timed out)."""


class PermanentError(GpulensError):
    """Retrying the same call cannot help: bad input, bad configuration, a refused request."""


class UserError(PermanentError):
    """Something the user can fix: a bad flag, a missing tool, an unreachable dependency."""
