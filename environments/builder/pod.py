"""A build in a pod (``python -m environments.builder.pod fetch|run|report``): the three
containers of a build's Kubernetes Job (``jobs.launchers.kubernetes.builds``), in order.

- ``fetch`` (an init container, with the build's token): downloads the pushed wheel and the
  organization's pushed datasets from Lab (``/api/v1/environment-builds/<id>/wheel``,
  ``.../datasets``) into ``BUILD_DIR/in``;
- ``run`` (an init container, WITHOUT the token: the package's code runs here): runs the builder
  (``python -m environments.builder build ...``) with a timeout, its output into
  ``BUILD_DIR/out/build.log``, and always exits 0 (its exit and timeout in ``out/run.json``), so
  that the report runs;
- ``report`` (the container, with the token): uploads the wheels of the lock that Lab's
  wheelhouse lacks (Lab checks each one's SHA-256), the Hugging Face datasets tar the builder
  packed (likewise), the log, then the result. Lab's worker reads
  the result once the Job has completed (``environments.pod_builds``).

The token is never in the container that runs package code, nor in a file it can read. No
Django here: the standard library only, as the engine image runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

#: The pod's one writable volume (an emptyDir) and its folders.
BUILD_DIR = "/var/lab/build"
IN_DIR, OUT_DIR = f"{BUILD_DIR}/in", f"{BUILD_DIR}/out"
WHEELHOUSE_DIR, WORK_DIR, CACHE_DIR, HOME_DIR = (f"{BUILD_DIR}/{name}" for name in ("wheelhouse", "work", "cache", "home"))
DATASETS_DIR = f"{IN_DIR}/datasets"
#: The variable the token travels in (from the build's Secret, in ``fetch`` and ``report`` only).
TOKEN_VARIABLE = "LAB_BUILD_TOKEN"
#: Where the builder packs the Hugging Face datasets loading fetched (``environments.hub_datasets.FILENAME``).
HUB_DATASETS_FILENAME = "hub-datasets.tar"
#: The longest log uploaded, in bytes (its end), as ``environments.builds.MAX_LOG_BYTES``.
MAX_LOG_BYTES = 4 * 1024 * 1024
_CHUNK = 1024 * 1024


def _request(url: str, *, method: str = "GET", data=None, content_type: str = "application/octet-stream", length: int | None = None):
    headers = {"Authorization": f"Bearer {os.environ[TOKEN_VARIABLE]}"}
    if data is not None:
        headers["Content-Type"] = content_type
        if length is not None:
            headers["Content-Length"] = str(length)
    return urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers), timeout=300)


def _base(args) -> str:
    return f"{args.lab_url.rstrip('/')}/api/v1/environment-builds/{args.build}"


def fetch(args) -> int:
    """Download the wheel to ``in/<file name>`` and unpack the datasets into ``in/datasets``."""
    inbox = Path(args.dir) / "in"
    (inbox / "datasets").mkdir(parents=True, exist_ok=True)
    with _request(f"{_base(args)}/wheel") as response, (inbox / args.filename).open("wb") as out:
        while chunk := response.read(_CHUNK):
            out.write(chunk)
    archive = inbox / "datasets.tar"
    with _request(f"{_base(args)}/datasets") as response, archive.open("wb") as out:
        while chunk := response.read(_CHUNK):
            out.write(chunk)
    with tarfile.open(archive, mode="r:") as tar:
        tar.extractall(inbox / "datasets", filter="data")
    archive.unlink()
    print(f"fetched {args.filename} ({(inbox / args.filename).stat().st_size} bytes) and the organization's datasets", flush=True)
    return 0


def run(args) -> int:
    """Run the builder command (after ``--``) with ``--timeout``; its output into ``out/build.log``."""
    out = Path(args.dir) / "out"
    out.mkdir(parents=True, exist_ok=True)
    environment = {name: value for name, value in os.environ.items() if name != TOKEN_VARIABLE}
    started = time.monotonic()
    with (out / "build.log").open("wb") as log:
        process = subprocess.Popen(args.command, stdout=log, stderr=subprocess.STDOUT, env=environment, start_new_session=True)
        try:
            returncode, timed_out = process.wait(timeout=args.timeout), False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            returncode, timed_out = process.wait(), True
    (out / "run.json").write_text(json.dumps({"returncode": returncode, "timed_out": timed_out, "seconds": time.monotonic() - started}))
    return 0


def result_of(out: Path, timeout: int) -> dict:
    """The build's result: the builder's result file, or a failure saying why there is none."""
    ran = json.loads((out / "run.json").read_text()) if (out / "run.json").is_file() else {}
    if ran.get("timed_out"):
        return {"status": "failed", "error": f"the build took longer than {timeout} s (LAB_ENVIRONMENT_BUILD_TIMEOUT_S)"}
    if (out / "result.json").is_file():
        try:
            return json.loads((out / "result.json").read_text())
        except ValueError:
            pass
    return {"status": "failed", "error": f"the builder crashed (exit {ran.get('returncode')}): see the build log"}


def report(args) -> int:
    """Upload the lock's wheels that Lab lacks, the log, then the result."""
    directory = Path(args.dir)
    result = result_of(directory / "out", args.timeout)
    uploaded = 0
    for entry in result.get("lock") or [] if result.get("status") == "ready" else []:
        path = directory / "wheelhouse" / entry["sha256"] / entry["filename"]
        url = f"{_base(args)}/wheelhouse/{entry['sha256']}/{entry['filename']}"
        try:
            _request(url, method="HEAD").close()
            continue  # Lab has it
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise
        with path.open("rb") as body:
            _request(url, method="PUT", data=body, length=path.stat().st_size).close()
        uploaded += 1
    fetched = (result.get("summary") or {}).get("hub_datasets") if result.get("status") == "ready" else None
    if fetched:  # the Hugging Face datasets loading fetched, packed by the builder (environments.hub_datasets)
        url, tar = f"{_base(args)}/hub-datasets/{fetched['sha256']}", directory / "out" / HUB_DATASETS_FILENAME
        try:
            _request(url, method="HEAD").close()
        except urllib.error.HTTPError as error:
            if error.code != 404:
                raise
            with tar.open("rb") as body:
                _request(url, method="PUT", data=body, length=tar.stat().st_size, content_type="application/x-tar").close()
    log = directory / "out" / "build.log"
    data = log.read_bytes()[-MAX_LOG_BYTES:] if log.is_file() else b""
    _request(f"{_base(args)}/log", method="PUT", data=data, content_type="text/plain").close()
    _request(f"{_base(args)}/result", method="PUT", data=json.dumps(result).encode(), content_type="application/json").close()
    print(f"reported {result.get('status')}: {uploaded} wheels uploaded, {len(data)} bytes of log", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m environments.builder.pod", description="One step of a build in a pod.")
    parser.add_argument("step", choices=["fetch", "run", "report"])
    parser.add_argument("--dir", default=BUILD_DIR, help="the pod's build folder")
    parser.add_argument("--lab-url", default="")
    parser.add_argument("--build", default="")
    parser.add_argument("--filename", default="", help="the pushed wheel's file name")
    parser.add_argument("--timeout", type=int, default=1800, help="the builder's limit, in seconds")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1:]  # run: the builder's command, after --
    return {"fetch": fetch, "run": run, "report": report}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
