"""Sinks: every topic into ClickHouse exactly once."""
