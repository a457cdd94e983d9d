"""Lab's REST conventions (DESIGN.md §4): authentication, tenancy, errors, lists, idempotency."""
