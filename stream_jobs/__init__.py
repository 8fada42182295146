"""Stream jobs: faust workers joining samples with pod state into windows, capacity, lifecycle records and alerts."""
