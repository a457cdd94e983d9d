"""Run the sandbox agent: ``python -m sandboxes.agent --root DIR [--host H] [--port P]``.

The key it checks tokens with comes from ``LAB_SANDBOX_AGENT_SECRET`` (or the file named by
``LAB_SANDBOX_AGENT_SECRET_FILE``), never from the command line: Lab's secret for the one agent of
a machine (``python manage.py sandbox_agent`` starts it with Lab's settings), the pod's own key on
the Kubernetes pool (written by ``python -m sandboxes.agent.pod_key``). It serves HTTP with uvicorn.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import uvicorn

from sandboxes.agent import tokens
from sandboxes.agent.app import Agent
from sandboxes.runtime.cgroups import MemoryCgroups
from sandboxes.runtime.local import LocalHost, claim_uid_block


def secret_from_environment(environ=os.environ) -> bytes:
    """Return the agent's key (at least 32 characters); exit with a message without one."""
    try:
        return tokens.secret_from_environment(environ)
    except (ValueError, OSError) as error:
        sys.exit(str(error))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandboxes.agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="folder of the sandboxes' files")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--max-processes", type=int, default=256, help="processes per sandbox")
    parser.add_argument("--max-open-files", type=int, default=1024, help="open files per process")
    parser.add_argument("--max-output-bytes", type=int, default=1024 * 1024, help="kept of each output stream")
    parser.add_argument("--warm", type=int, default=4, help="sandboxes kept started ahead (0: none)")
    parser.add_argument("--images", type=Path, default=None,
                        help="folder of the sandbox images (default: LAB_SANDBOX_IMAGES_DIR or var/sandbox-images)")
    args = parser.parse_args(argv)
    uid_block, _held = claim_uid_block()
    host = LocalHost(args.root, max_processes=args.max_processes, max_open_files=args.max_open_files,
                     cgroups=MemoryCgroups.detect(), uid_block=uid_block, images=args.images)
    agent = Agent(host, secret=secret_from_environment(), max_output_bytes=args.max_output_bytes, warm=args.warm)
    uvicorn.run(agent, host=args.host, port=args.port, log_level="warning", lifespan="on", access_log=False)


if __name__ == "__main__":
    main()
