"""gpulens: see what a Kubernetes GPU fleet is really doing.

This package holds the application layer — the ``gpulens`` CLI, the local Kafka broker manager,
``gpulens top`` and the demo — which wires simulation, reports, producers, stream jobs and sinks
together (docs/DEVELOPING.md has the layers).
"""

__version__ = "0.1.0"
