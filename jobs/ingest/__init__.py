"""The ingest API engines report to (DESIGN.md §4 "Ingest API"), authenticated by job tokens."""
