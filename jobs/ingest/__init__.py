"""The ingest API engines report to (docs/ingest-api.md), authenticated by job tokens."""
