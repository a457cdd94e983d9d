"""Jobs: specs, the job state machine, admission and queue, launchers, ingest, metrics, stream."""
