"""REST endpoints for jobs and the ingest API engines report to."""
