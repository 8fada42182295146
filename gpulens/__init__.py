"""gpulens: see what a Kubernetes GPU fleet is really doing.

This package holds the application layer — the ``gpulens`` CLI, the local Kafka broker manager,
the fleet simulator and the demo — which wires producers, stream jobs and sinks together.
"""

__version__ = "0.1.0"
