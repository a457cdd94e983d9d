"""Write the key of one agent of the Kubernetes pool: ``python -m sandboxes.agent.pod_key --out FILE``,
the init container of each pool pod (k8s/sandbox-pool/pool.yaml; docs/kubernetes.md "Sandbox pool").

It reads Lab's secret (``LAB_SANDBOX_AGENT_SECRET``, or the file ``LAB_SANDBOX_AGENT_SECRET_FILE``
names) and the pod's uid (``LAB_SANDBOX_AGENT_IDENTITY``, from the downward API), and writes
``tokens.agent_key`` of them to FILE, readable by its owner alone. The agent's container mounts
that file's folder and not Lab's Secret, and reads its key as ``LAB_SANDBOX_AGENT_SECRET_FILE``:
whoever takes over one pod's agent holds that pod's key, which opens no other pod's sandboxes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sandboxes.agent import tokens

#: The variable holding the agent's identity: its pod's uid.
IDENTITY_VARIABLE = "LAB_SANDBOX_AGENT_IDENTITY"


def write_key(out: Path, environ=os.environ) -> None:
    """Write the key of the agent ``environ`` names to ``out`` (mode 0400, replaced atomically);
    ValueError without Lab's secret or an identity."""
    identity = environ.get(IDENTITY_VARIABLE, "").strip()
    if not identity:
        raise ValueError(f"{IDENTITY_VARIABLE} (the pod's uid) is not set")
    key = tokens.agent_key(tokens.secret_from_environment(environ), identity)
    writing = out.with_name(f".{out.name}.writing")
    writing.unlink(missing_ok=True)
    descriptor = os.open(writing, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    with os.fdopen(descriptor, "w") as file:
        file.write(key + "\n")
    writing.replace(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandboxes.agent.pod_key", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the file the agent's key is written to")
    args = parser.parse_args(argv)
    try:
        write_key(args.out)
    except (ValueError, OSError) as error:
        print(f"the sandbox agent's key was not written: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
