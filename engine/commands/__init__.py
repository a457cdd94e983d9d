"""The engine's subcommands, one module each (`python -m engine <command>`, engine/cli.py):
`run` (an attempt, or its trainer role), `orchestrator`, `inference`, `prepare-model`. Each
imports at its top what it runs; engine/cli.py parses the command line and calls one."""
