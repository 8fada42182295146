"""Tests of the node agent (issue 3)."""
