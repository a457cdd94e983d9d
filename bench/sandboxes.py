"""Benchmarks ``sandbox_create_ms``, ``sandbox_first_command_ms`` and ``sandbox_exec_ms``.

A real uvicorn serves Lab on PostgreSQL and a real sandbox agent holds the sandboxes (bubblewrap);
this process drives them with the SDK (``labsdk.Lab``), as a client would, over HTTP on loopback:
creates through Lab's API, commands straight to the agent's data plane.

- ``sandbox_create_ms``: ``POST /sandboxes`` until its answer (the sandbox is ``running``: request
  to ready), p50 and p99 over ``--sandboxes`` sandboxes. Baseline: the goal, p50 100 ms.
- ``sandbox_first_command_ms``: from sending the create to the end of the first command's answer
  (``true``), p50 and p99.
- ``sandbox_exec_ms``: a trivial command's (``true``) round trip through the SDK and the data plane
  (the agent and the sandbox's supervisor), p50 and p99 over ``--commands`` commands. Baseline:
  the goal, p50 15 ms.

- ``sandbox_create_ms_prime`` and ``sandbox_exec_ms_prime``: the same through Prime's own
  ``prime-sandboxes`` SDK (``SandboxClient.create`` at ``<lab>/prime``; ``execute_command`` over
  Connect RPC to the agent's gateway), beside Lab's SDK.

Each of these lines also carries ``get_sandbox_p50_ms``, a ``GET /sandboxes/{id}`` through the same
client and server: what the API itself costs a request, beside what the sandbox adds.

- ``sandbox_exec_per_s``: trivial commands (``true``) per second through Lab's SDK and the data plane
  from ``--clients`` threads of this process, each with its own ``Lab`` client and its own sandbox,
  over ``--duration`` seconds; the line carries the commands' latency under that load (p50, p99).
- ``sandboxes_idle_max``: sandboxes created one after another and left idle until ``--idle-max``
  (or until a create fails), then each asked to run ``true``; the value is how many were held and
  answered. ``sandbox_idle_mib`` is the resident memory per idle sandbox: the growth, over those
  sandboxes, of the agent's process tree (the agent, bwrap and each sandbox's supervisor), as the
  sum of RSS (shared pages counted in every process) and of PSS (shared pages divided among
  them). They are deleted together at the end through Prime's bulk delete (``DELETE /sandbox``).
  Baseline: the goal, 200 idle sandboxes on 2 cores and 24 GB.

The bench sets the organization's cap (``LAB_SANDBOX_MAX_PER_ORG``) above the most sandboxes it holds.

Usage: ``python bench/sandboxes.py [--sandboxes 20] [--commands 50] [--clients 32] [--duration 5]
[--idle-max 200]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import _django
import httpx
from _proc import rss_kib


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandboxes", type=int, default=20, help="sandboxes created")
    parser.add_argument("--commands", type=int, default=50, help="trivial commands timed")
    parser.add_argument("--clients", type=int, default=32, help="concurrent clients of sandbox_exec_per_s")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of sandbox_exec_per_s")
    parser.add_argument("--idle-max", type=int, default=200, help="idle sandboxes created at most")
    args = parser.parse_args()
    url = _django.setup()

    from django.conf import settings
    from labsdk import Lab

    from lab.bootstrap import bootstrap_tenant
    from tests.support.sandbox_agent import start_agent
    from tests.support.stack import wait_for

    result = bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    agent = start_agent(max_processes=256, max_open_files=1024, warm=4)
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": settings.SECRET_KEY, "LAB_PUBLIC_URL": base,
           "LAB_API_RATE_LIMIT_PER_MINUTE": "1000000", "LAB_SANDBOX_MAX_PER_ORG": str(max(args.sandboxes, args.clients, args.idle_max) + 1),
           "LAB_SANDBOX_AGENT_URL": agent.url, "LAB_SANDBOX_AGENT_SECRET": agent.secret}
    web = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "lab.asgi:application", "--host", "127.0.0.1", "--port", str(port),
         "--log-level", "warning"],
        cwd=_django.REPO, env=env,
    )
    try:
        wait_for(lambda: _healthy(base), timeout=60, what="the web server")
        with Lab(api_key=result["api_key"], base_url=base) as lab:
            lab.sandboxes.run(lab.sandboxes.create().id, "true")  # warm: imports, connections
            created, first = [], []
            sandbox_ids = []
            for _ in range(args.sandboxes):
                started = time.perf_counter()
                sandbox = lab.sandboxes.create(timeout_s=600)
                created.append((time.perf_counter() - started) * 1000)
                answer = lab.sandboxes.run(sandbox.id, "true")
                first.append((time.perf_counter() - started) * 1000)
                assert sandbox.status == "running" and answer.exit_code == 0, (sandbox, answer)
                sandbox_ids.append(sandbox.id)
            executed = []
            for _ in range(args.commands):
                started = time.perf_counter()
                answer = lab.sandboxes.run(sandbox_ids[0], "true")
                executed.append((time.perf_counter() - started) * 1000)
                assert answer.exit_code == 0, answer
            read = []
            for _ in range(args.commands):
                started = time.perf_counter()
                lab.sandboxes.get(sandbox_ids[0])
                read.append((time.perf_counter() - started) * 1000)
            for sandbox_id in sandbox_ids:
                lab.sandboxes.delete(sandbox_id)
        prime_created, prime_executed = _prime_sdk(base, result["api_key"], sandboxes=args.sandboxes, commands=args.commands)
        for name, values, baseline in (
            ("sandbox_create_ms", created, 100.0),
            ("sandbox_first_command_ms", first, None),
            ("sandbox_exec_ms", executed, 15.0),
            ("sandbox_create_ms_prime", prime_created, 100.0),
            ("sandbox_exec_ms_prime", prime_executed, 15.0),
        ):
            _django.report(name, statistics.median(values), "ms", baseline, p99_ms=round(_p99(values), 3), n=len(values),
                           get_sandbox_p50_ms=round(statistics.median(read), 3))
        commands, seconds, latencies = _exec_load(base, result["api_key"], clients=args.clients, duration_s=args.duration)
        _django.report("sandbox_exec_per_s", commands / seconds, "commands/s", None, clients=args.clients,
                       seconds=round(seconds, 3), n=commands, p50_ms=round(statistics.median(latencies), 3),
                       p99_ms=round(_p99(latencies), 3), load_average=_load_average())
        _idle(base, result["api_key"], agent_pid=agent.process.pid, limit=args.idle_max)
    finally:
        web.terminate()
        web.wait(timeout=30)
        agent.stop()


def _prime_sdk(base: str, api_key: str, *, sandboxes: int, commands: int) -> tuple[list[float], list[float]]:
    """Time creates and trivial commands through ``prime-sandboxes``' own SandboxClient (ms)."""
    import tempfile

    os.environ.update(PRIME_API_BASE_URL=f"{base}/prime", PRIME_DISABLE_VERSION_CHECK="1", HOME=tempfile.mkdtemp())
    from prime_sandboxes import APIClient, CreateSandboxRequest, SandboxClient

    client = SandboxClient(APIClient(api_key=api_key))
    created, executed, ids = [], [], []
    for _ in range(sandboxes):
        started = time.perf_counter()
        sandbox = client.create(CreateSandboxRequest(name="bench", docker_image="python:3.11", timeout_minutes=10))
        created.append((time.perf_counter() - started) * 1000)
        ids.append(sandbox.id)
    client.execute_command(ids[0], "true")  # warm: the connection
    for _ in range(commands):
        started = time.perf_counter()
        assert client.execute_command(ids[0], "true").exit_code == 0
        executed.append((time.perf_counter() - started) * 1000)
    client.bulk_delete(sandbox_ids=ids)
    return created, executed


def _load_average() -> float:
    """The machine's one-minute load average (what else ran beside the bench)."""
    return round(os.getloadavg()[0], 2)


def _exec_load(base: str, api_key: str, *, clients: int, duration_s: float) -> tuple[int, float, list[float]]:
    """Run ``true`` from ``clients`` threads, each with its own SDK client and sandbox, for ``duration_s``
    seconds; return the commands answered, the seconds from the common start to the last answer,
    and each command's round trip (ms). A failed command fails the bench."""
    from labsdk import Lab

    ready = threading.Barrier(clients + 1)
    latencies: list[list[float]] = [[] for _ in range(clients)]
    ends = [0.0] * clients
    errors: list[BaseException] = []
    deadline = [0.0]

    def client(index: int) -> None:
        sandbox_id = None
        with Lab(api_key=api_key, base_url=base) as lab:
            try:
                sandbox_id = lab.sandboxes.create(timeout_s=600).id
                lab.sandboxes.run(sandbox_id, "true")  # warm: the connection to the agent
                ready.wait()
                while time.perf_counter() < deadline[0]:
                    started = time.perf_counter()
                    answer = lab.sandboxes.run(sandbox_id, "true")
                    ends[index] = time.perf_counter()
                    latencies[index].append((ends[index] - started) * 1000)
                    assert answer.exit_code == 0, answer
            except BaseException as error:  # noqa: BLE001 -- the main thread raises it
                errors.append(error)
                ready.abort()
            finally:
                if sandbox_id is not None:
                    lab.sandboxes.delete(sandbox_id)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(clients)]
    for thread in threads:
        thread.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        pass
    started = time.perf_counter()
    deadline[0] = started + duration_s
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    flat = [value for values in latencies for value in values]
    return len(flat), max(ends) - started, flat


def _tree_pids(root: int) -> list[int]:
    """``root`` and every process below it (``/proc/<pid>/stat``'s parent field)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # ended meanwhile
        children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def _pss_kib(pid: int) -> int:
    """A process's proportional set size in KiB (``/proc/<pid>/smaps_rollup``'s ``Pss``)."""
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1])
    raise RuntimeError("no Pss")


def _tree_memory_kib(root: int) -> tuple[int, int, int]:
    """The process tree under ``root``: its processes, and the sums of their RSS and PSS (KiB)."""
    processes = rss = pss = 0
    for pid in _tree_pids(root):
        try:
            rss_one, pss_one = rss_kib(pid), _pss_kib(pid)
        except (OSError, RuntimeError):
            continue  # ended meanwhile, or a kernel thread
        processes, rss, pss = processes + 1, rss + rss_one, pss + pss_one
    return processes, rss, pss


def _answers(lab, sandbox_id: str) -> bool:
    """Whether the sandbox still runs ``true`` (exit status 0) through the SDK."""
    from labsdk.errors import LabError

    try:
        return lab.sandboxes.run(sandbox_id, "true", timeout_s=30).exit_code == 0
    except LabError:
        return False


def _idle(base: str, api_key: str, *, agent_pid: int, limit: int) -> None:
    """Create idle sandboxes until ``limit`` or a refused create, check each still runs ``true``,
    report ``sandboxes_idle_max`` and ``sandbox_idle_mib``, and bulk-delete them."""
    from labsdk import Lab
    from labsdk.errors import LabError
    from prime_sandboxes import APIClient, SandboxClient  # at <lab>/prime: _prime_sdk set its environment

    time.sleep(1)  # the agent refills its warm sandboxes after the load's deletes
    _, rss_before, pss_before = _tree_memory_kib(agent_pid)
    sandbox_ids, refusal = [], ""
    started = time.perf_counter()
    with Lab(api_key=api_key, base_url=base) as lab:
        for _ in range(limit):
            try:
                sandbox_ids.append(lab.sandboxes.create(timeout_s=1800).id)
            except LabError as error:
                refusal = str(error)[:200]
                break
        created_s = time.perf_counter() - started
        time.sleep(1)  # the warm sandboxes taken are started again, as before the creates
        processes, rss_after, pss_after = _tree_memory_kib(agent_pid)
        answered = sum(_answers(lab, sandbox_id) for sandbox_id in sandbox_ids)
    held = len(sandbox_ids)
    started = time.perf_counter()
    deleted = SandboxClient(APIClient(api_key=api_key)).bulk_delete(sandbox_ids=sandbox_ids)
    delete_s = time.perf_counter() - started
    assert len(deleted.succeeded) == held, deleted
    per = max(held, 1) * 1024
    _django.report("sandboxes_idle_max", answered, "sandboxes", 200.0, held=held, limit=limit, refusal=refusal,
                   create_s=round(created_s, 3), bulk_delete_s=round(delete_s, 3), agent_processes=processes,
                   agent_rss_mib=round(rss_after / 1024, 1), agent_pss_mib=round(pss_after / 1024, 1),
                   cores=os.cpu_count(), memory_gib=round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30, 1),
                   load_average=_load_average())
    _django.report("sandbox_idle_mib", (rss_after - rss_before) / per, "MiB", None, n=held,
                   pss_mib=round((pss_after - pss_before) / per, 3), load_average=_load_average())


if __name__ == "__main__":
    main()
