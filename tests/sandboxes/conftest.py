"""Fixtures for sandbox tests: one real sandbox agent for the session, and every test's Lab
pointed at it (``runtime`` is the control plane's client of it)."""

from __future__ import annotations

import pytest

from sandboxes import services
from sandboxes.runtime.agent import AgentRuntime
from tests.support.sandbox_agent import RunningAgent, start_agent


@pytest.fixture(scope="session")
def agent() -> RunningAgent:
    # An agent that does not start fails every test that needs it (bubblewrap is installed by
    # make install and .ci/run), rather than skipping them.
    running = start_agent()
    yield running
    running.stop()


@pytest.fixture(autouse=True)
def runtime(agent, settings) -> AgentRuntime:
    """The runtime every sandbox service of the test uses: the session's agent."""
    settings.LAB_SANDBOX_AGENT_URL = agent.url
    settings.LAB_SANDBOX_DATA_PLANE_URL = agent.url
    settings.LAB_SANDBOX_AGENT_SECRET = agent.secret
    client = services.runtime()
    client.root = agent.root
    return client
