"""Errors the CLI reports to the user as one clear line, never as a traceback."""


class UserError(Exception):
    """Something the user can fix: a bad flag, a missing tool, an unreachable dependency."""
