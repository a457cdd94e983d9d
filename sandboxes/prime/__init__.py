"""Prime Intellect's sandbox API over Lab's sandboxes, as ``prime-sandboxes`` 0.5.1 and ``prime
sandbox`` of the ``prime`` CLI 0.18.0 call it (docs/prime-compat.md "Sandboxes"): the control
plane under ``/prime/api/v1/sandbox``; commands and files go to the agent's gateway routes
(``sandboxes.agent.prime``) with the token ``/sandbox/{id}/auth`` gives."""
