"""Stand-in for ``lightning`` (see ``lightning.pytorch``)."""
