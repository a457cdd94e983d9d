"""Lab's REST conventions (docs/api.md): authentication, tenancy, errors, lists, idempotency."""
