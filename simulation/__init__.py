"""Simulation: scenario files, the simulated fleet that turns them into the producers' messages,
and the replays that play them through the stream jobs (in process, through Kafka and faust
workers, or through a real kube-apiserver and the watcher). Above the parts, below the CLI; the
golden scenarios and their expected reports live in ``simulation/scenarios/``."""
