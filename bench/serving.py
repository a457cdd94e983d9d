"""Serving through Lab against straight at the inference server, and adapters sharing one server.

A real engine server (``python -m engine serve``, transformers, the tiny model, as Lab starts
one) and a real uvicorn serving Lab's OpenAI-compatible API on PostgreSQL, with one ready
deployment of the base model on that server. Requests alternate, same prompt, same run: one
streamed through Lab (API key), one streamed straight at the server (its token).

- ``serving_overhead_ms`` (p50, and p99 in ``p99``): time to the first sampled token through Lab
  minus straight at the server, the percentiles of each side subtracted (goal p50 ≤ 10 ms); the
  percentiles of the differences of each pair of requests (one through Lab, the next straight)
  are given too, as an outlier on one side makes the subtracted p99 swing (even below zero).
- ``serving_tokens_per_s_ratio``: streamed completion tokens per second (over the whole request,
  as its caller waits for it) through Lab over straight, medians of ``--tokens``-token answers
  (goal ≥ 0.95); the median gap between sampled chunks as they arrive is given for each side.
- ``serving_adapters_per_server``: LoRA adapters resident on one base server (``--adapters``), with
  that server's resident memory against one server per adapter (each server's own memory with one
  adapter, times the adapters).

    python bench/serving.py [--requests 40] [--tokens 256] [--adapters 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _django
import httpx
from _proc import rss_kib

TINY = "lab/tiny-random-llama"
TOKEN = "bench-serving-token"


def start_server(workdir: Path, max_adapters: int) -> tuple[subprocess.Popen, str]:
    """Start an engine serving process of the tiny model as Lab's local runtime does; return it
    and its URL once it answers its health check."""
    workdir.mkdir(parents=True, exist_ok=True)
    address = workdir / "address.json"
    command = [sys.executable, "-m", "engine", "serve", "--model", TINY, "--served-model", TINY, "--max-adapters", str(max_adapters),
               "--address-file", str(address), "--backend", "transformers", "--workdir", str(workdir / "work")]
    process = subprocess.Popen(command, cwd=_django.REPO, env={**os.environ, "LAB_SERVING_TOKEN": TOKEN},
                               stdout=subprocess.DEVNULL, stderr=open(workdir / "stderr.log", "wb"))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the engine server exited {process.returncode}: {(workdir / 'stderr.log').read_text()[-2000:]}")
        if address.exists() and address.stat().st_size:
            url = json.loads(address.read_text())["url"]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return process, url
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("the engine server did not start within 180 s")


def stream(client: httpx.Client, url: str, key: str, body: dict) -> tuple[float, float, int, list[float]]:
    """Stream one chat completion; return (seconds to the first sampled chunk, seconds from the
    request to the last chunk, completion tokens, seconds between sampled chunks as they arrived)."""
    started = time.perf_counter()
    first = last = None
    tokens = 0
    arrivals = []
    with client.stream("POST", url, json=body, headers={"Authorization": f"Bearer {key}"}) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"])
            if any((choice.get("delta") or {}).get("content") for choice in chunk.get("choices") or ()):
                last = time.perf_counter()
                first = first or last
                arrivals.append(last)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if first is None:
        raise RuntimeError("the answer had no sampled text")
    return first - started, last - started, tokens, [later - earlier for earlier, later in zip(arrivals, arrivals[1:])]


def percentile(values: list[float], point: float) -> float:
    """Nearest-rank percentile ``point`` (0 to 100) of ``values``."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(point / 100 * len(ordered) + 0.5) - 1))]


def measure_overhead(args, work: Path) -> None:
    url = _django.setup(work / "data")
    from django.conf import settings

    from jobs.processes import free_port
    from lab.bootstrap import bootstrap_tenant
    from lab.models import Project
    from serving.models import Deployment, DeploymentStatus, InferenceServer, ServerStatus, ServingMode, SourceType
    from tests.support.stack import wait_for

    result = bootstrap_tenant(organization_slug="bench", project_slug="bench", email="bench@example.com", password=None)
    project = Project.objects.select_related("organization").get(slug="bench")
    server, server_url = start_server(work / "server", max_adapters=1)
    inference = InferenceServer.objects.create(key=f"base:{TINY}", model=TINY, served_model=TINY, status=ServerStatus.RUNNING,
                                               url=server_url, token=TOKEN, generation=1, handle={"workdir": str(work / "server")})
    Deployment.objects.create(organization=project.organization, project=project, name="bench", source_type=SourceType.MODEL,
                              source_id=TINY, base_model=TINY, mode=ServingMode.BASE, server=inference, status=DeploymentStatus.READY)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": settings.SECRET_KEY, "LAB_PUBLIC_URL": base, "DB_CONN_MAX_AGE": "60",
           "LAB_INFERENCE_RATE_LIMIT_PER_MINUTE": "1000000", "LAB_SERVING_IDLE_S": "100000"}
    web = subprocess.Popen([sys.executable, "-m", "uvicorn", "lab.asgi:application", "--host", "127.0.0.1", "--port", str(port),
                            "--log-level", "warning"], cwd=_django.REPO, env=env)
    try:
        wait_for(lambda: _healthy(base), timeout=60, what="the web server")
        messages = [{"role": "user", "content": "Count to a hundred."}]
        common = {"messages": messages, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        targets = {
            "lab": (f"{base}/api/v1/openai/v1/chat/completions", result["api_key"], "bench"),
            "direct": (f"{server_url}/v1/chat/completions", TOKEN, TINY),
        }
        first_token = {"lab": [], "direct": []}
        rates = {"lab": [], "direct": []}
        gaps = {"lab": [], "direct": []}
        with httpx.Client(timeout=120) as client:
            for side, (endpoint, key, model) in targets.items():  # warm both paths (connections, first queries)
                stream(client, endpoint, key, {**common, "model": model, "max_tokens": 4})
            for _ in range(args.requests):  # time to first token: one-token answers
                for side, (endpoint, key, model) in targets.items():
                    first_token[side].append(stream(client, endpoint, key, {**common, "model": model, "max_tokens": 1})[0])
            for _ in range(args.rate_requests):  # tokens per second: long answers
                for side, (endpoint, key, model) in targets.items():
                    _, seconds, tokens, between = stream(client, endpoint, key, {**common, "model": model, "max_tokens": args.tokens})
                    rates[side].append(tokens / seconds)  # over the whole request, as its caller waits for it
                    gaps[side].extend(between)
        p50 = (percentile(first_token["lab"], 50) - percentile(first_token["direct"], 50)) * 1000
        p99 = (percentile(first_token["lab"], 99) - percentile(first_token["direct"], 99)) * 1000
        pairs = [(lab - direct) * 1000 for lab, direct in zip(first_token["lab"], first_token["direct"], strict=True)]
        _django.report("serving_overhead_ms", p50, "ms", 10.0, p99=round(p99, 3), requests=args.requests,
                       pairwise_p50_ms=round(percentile(pairs, 50), 3), pairwise_p99_ms=round(percentile(pairs, 99), 3),
                       lab_ttft_p50_ms=round(percentile(first_token["lab"], 50) * 1000, 3),
                       direct_ttft_p50_ms=round(percentile(first_token["direct"], 50) * 1000, 3),
                       lab_ttft_p99_ms=round(percentile(first_token["lab"], 99) * 1000, 3),
                       direct_ttft_p99_ms=round(percentile(first_token["direct"], 99) * 1000, 3))
        lab_rate, direct_rate = statistics.median(rates["lab"]), statistics.median(rates["direct"])
        _django.report("serving_tokens_per_s_ratio", lab_rate / direct_rate, "ratio", 0.95, tokens_per_request=args.tokens,
                       requests=args.rate_requests, lab_tokens_per_s=round(lab_rate, 1), direct_tokens_per_s=round(direct_rate, 1),
                       lab_chunk_gap_p50_ms=round(percentile(gaps["lab"], 50) * 1000, 3),
                       direct_chunk_gap_p50_ms=round(percentile(gaps["direct"], 50) * 1000, 3))
    finally:
        web.terminate()
        web.wait(timeout=30)
        server.terminate()
        server.wait(timeout=30)


def measure_adapters(args, work: Path) -> None:
    from tests.support.tiny_lora import tiny_lora

    directories = []
    for number in range(args.adapters):
        directory = work / "adapters" / f"adp_{number}"
        tiny_lora(0.1 * (number + 1))[0].save_pretrained(directory)
        directories.append(directory)
    body = {"model": "", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def serve(server_url: str, names: list[str]) -> None:
        for name in names:
            answer = httpx.post(f"{server_url}/v1/chat/completions", json={**body, "model": name}, headers=headers, timeout=120)
            answer.raise_for_status()

    shared, shared_url = start_server(work / "shared", max_adapters=args.adapters)
    try:
        for number, directory in enumerate(directories):
            httpx.post(f"{shared_url}/v1/adapters", json={"name": f"adp_{number}", "path": str(directory)}, headers=headers,
                       timeout=120).raise_for_status()
        serve(shared_url, [f"adp_{number}" for number in range(args.adapters)])
        resident = httpx.get(f"{shared_url}/health", timeout=10).json()["adapters"]["resident"]
        shared_kib = rss_kib(shared.pid)
    finally:
        shared.terminate()
        shared.wait(timeout=30)
    single, single_url = start_server(work / "single", max_adapters=1)
    try:
        httpx.post(f"{single_url}/v1/adapters", json={"name": "adp_0", "path": str(directories[0])}, headers=headers,
                   timeout=120).raise_for_status()
        serve(single_url, ["adp_0"])
        single_kib = rss_kib(single.pid)
    finally:
        single.terminate()
        single.wait(timeout=30)
    separate_mib = single_kib * args.adapters / 1024
    _django.report("serving_adapters_per_server", len(resident), "adapters", None, memory_mib=round(shared_kib / 1024, 1),
                   one_server_per_adapter_mib=round(separate_mib, 1), memory_ratio=round(shared_kib / 1024 / separate_mib, 3),
                   one_adapter_server_mib=round(single_kib / 1024, 1))


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=40, help="one-token requests per side for the time to first token")
    parser.add_argument("--rate-requests", type=int, default=6, help="long requests per side for tokens per second")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per long request")
    parser.add_argument("--adapters", type=int, default=8, help="adapters resident on the shared server")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lab-bench-serving-") as directory:
        work = Path(directory)
        measure_overhead(args, work)
        measure_adapters(args, work)


if __name__ == "__main__":
    main()
