"""Runtime pieces every gpulens service shares: settings, structured logging, metrics, Kafka adapter.

Everything here may be imported by producers, stream jobs, sinks and the CLI; nothing here imports
them back (checked by import-linter, see ``pyproject.toml``).
"""
