"""The sandbox agent: the data plane of sandboxes (docs/sandboxes.md "Data plane").

One agent process per machine holds the sandboxes of that machine (the local runtime; a warm
pod's agent holds one). Each sandbox is a long-lived set of bubblewrap namespaces whose first
process is a small supervisor (``supervisor.py``); the agent asks it to start commands and relays
their output. Clients reach the agent directly with a token scoped to one sandbox
(``tokens.py``), issued by Lab's control plane; the control plane itself starts and stops
sandboxes here with a control token. The agent imports nothing of Django.
"""
