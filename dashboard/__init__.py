"""The server-rendered dashboard: accounts, organizations, projects, API keys."""
