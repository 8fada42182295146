"""Reports: the questions asked of what the sink stored (``analyses``), the time series behind
the charts (``timeseries``), the right-sizing advice (``advise``) and the self-contained HTML
report. Reads through the sinks' reader; above the parts, below the CLI."""
