"""The trainer's rollouts through an inference role over HTTP (the routes of engine/inference.py).

    LAB_ENGINE_INFERENCE_URL=http://host:port   sample through that inference role
    LAB_ENGINE_INFERENCE=process                 `python -m engine run` starts one as a child process

Either way the trainer keeps its loop and its rollout-backend protocol (engine/rollout.py):
`generate` becomes one `POST /inference/v1/generate` per prompt (token ids in, token ids and
the sampled tokens' log-probabilities out, the answer's `policy_version` on every completion)
and `load_weights` writes the policy's weights (for LoRA the merged weights under the base
model's names) as one safetensors file into `LAB_ENGINE_WEIGHTS_DIR`, a directory both roles
see (on one host shared memory, `/dev/shm`; across pods a shared volume), then calls
`POST /update_weights` with its path and the policy version (docs/engine.md "How new weights
reach inference"). When the role says it applies LoRA adapters itself (`GET /health`'s
`"weights": "lora"`: vLLM started with `--max-lora-rank`), the trainer sends its adapter
instead (`load_adapter`: a peft directory, same route).

Seeds: prompt i of a call with seed s samples with seed s + i, so a batch is reproducible
from the spec's seed and the step, as in-process sampling is.

Errors: `InferenceUnavailable` when the role cannot be reached, keeps answering 5xx, refuses a
request, or (with `LAB_ENGINE_INFERENCE=process`) has exited; the engine exits 1 (a crash
Lab retries as a new attempt) with that message.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable

import httpx
import torch

from engine.config import child_environment
from engine.http_retry import RetriesExhausted, request_json
from engine.rollout import Completion

logger = logging.getLogger("engine")

#: Seconds the trainer waits for an inference role to answer `GET /health` at start.
READY_TIMEOUT_S = 600.0
#: Seconds one generate or weight-update request may take.
REQUEST_TIMEOUT_S = 600.0
#: Attempts per request on network errors and 5xx (capped backoff between them).
ATTEMPTS = 3


class InferenceUnavailable(Exception):
    """The inference role could not serve the trainer (unreachable, failing, exited)."""


class HttpRolloutBackend:
    """A rollout backend that samples through an inference role at `base_url` serving `model_id`.

    `weights_dir` is where `load_weights` writes each policy version (created; the previous
    version's file is removed once the role has loaded the next); None for a caller that only
    loads weights others wrote (`load_weights_dir`: the orchestrator role). `process` is the role's
    process when this engine started it (its exit is reported as the cause of a failure).
    """

    def __init__(
        self, base_url: str, *, model_id: str, weights_dir: pathlib.Path | None = None, process: subprocess.Popen | None = None,
        transport: httpx.BaseTransport | None = None, ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model_id = model_id
        self.weights_dir = weights_dir
        if weights_dir is not None:
            self.weights_dir.mkdir(parents=True, exist_ok=True)
        self.process = process
        self.policy_version = 0
        #: What the role takes of a LoRA policy: "lora" (the adapter, `load_adapter`) or "merged".
        self.weights_format = "merged"
        self._loaded: pathlib.Path | None = None
        self._client = httpx.Client(base_url=self.base_url, timeout=REQUEST_TIMEOUT_S, follow_redirects=False, transport=transport)
        self._wait_until_ready(ready_timeout)

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_process()
            try:
                health = self._client.get("/health", timeout=10)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise InferenceUnavailable(f"the inference role at {self.base_url} did not become ready within {timeout:.0f}s")
            time.sleep(0.5)
        served = [card.get("id") for card in self._request("GET", "/v1/models").get("data", [])]
        if self.model_id not in served:
            raise InferenceUnavailable(f"the inference role at {self.base_url} serves {served}, not {self.model_id!r}")
        self.policy_version = int(health.json().get("policy_version", 0))
        self.weights_format = "lora" if health.json().get("weights") == "lora" else "merged"
        logger.info("rollouts through the inference role at %s (%s)", self.base_url, health.json().get("backend"))

    def generate(
        self, prompts: list[list[int]], *, n: int, max_tokens: int, temperature: float, seed: int,
        stop_token_ids: Iterable[int] | None = None,
    ) -> list[Completion]:
        """Sample `n` completions per prompt (token ids) through the role, prompt by prompt."""
        completions = []
        for index, prompt in enumerate(prompts):
            params = {"n": n, "max_tokens": max_tokens, "temperature": temperature, "seed": seed + index,
                      "logprobs": 1, "skip_special_tokens": False}
            if stop_token_ids is not None:
                params["stop_token_ids"] = sorted(set(stop_token_ids))
            answer = self._request("POST", "/inference/v1/generate", {"model": self.model_id, "token_ids": prompt, "sampling_params": params})
            choices = answer.get("choices") or []
            if len(choices) != n:
                raise InferenceUnavailable(f"the inference role answered {len(choices)} completions, {n} were asked for")
            for choice in choices:
                completions.append(Completion(
                    token_ids=list(choice["token_ids"]),
                    logprobs=[entry["logprob"] for entry in choice["logprobs"]["content"]],
                    truncated=choice.get("finish_reason") == "length",
                    policy_version=int(answer["policy_version"]),
                ))
        return completions

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, policy_version: int | None = None) -> None:
        """Write the weights as `policy-<version>/model.safetensors` under `weights_dir` and have
        the role load them in place as `policy_version` (default the next version)."""
        version = self.policy_version + 1 if policy_version is None else policy_version
        directory = self.weights_dir / f"policy-{version}"
        write_weights(named_tensors, directory)
        self._load_written(directory, version)

    def load_adapter(self, adapter, *, policy_version: int | None = None) -> None:
        """Write a LoRA adapter (`engine.policy.PolicyAdapter`) as the peft directory
        `policy-<version>/` under `weights_dir` and have the role apply it as `policy_version`
        (default the next version)."""
        version = self.policy_version + 1 if policy_version is None else policy_version
        directory = adapter.save(self.weights_dir / f"policy-{version}")
        self._load_written(directory, version)

    def _load_written(self, directory: pathlib.Path, version: int) -> None:
        """Have the role load `directory`, then remove the directory it loaded before."""
        self.load_weights_dir(directory, version)
        if self._loaded is not None and self._loaded != directory:
            shutil.rmtree(self._loaded, ignore_errors=True)
        self._loaded = directory

    def load_weights_dir(self, directory: pathlib.Path, policy_version: int, *, restart: bool = False) -> None:
        """Have the role load the weights already written in `directory` (`write_weights`, or a
        peft adapter directory) as `policy_version`; `restart`: also when older than the loaded one (a new trainer session).
        Raises InferenceUnavailable when it refuses (e.g. an older version without `restart`)."""
        body = {"weights_path": str(directory), "policy_version": policy_version}
        if restart:
            body["restart"] = True
        answer = self._request("POST", "/update_weights", body)
        self.policy_version = int(answer["policy_version"])

    def close(self) -> None:
        """Close the connections, stop the role this engine started and remove the weight files."""
        self._client.close()
        stop_process(self.process)
        if self.weights_dir is not None:
            shutil.rmtree(self.weights_dir, ignore_errors=True)

    def _check_process(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise InferenceUnavailable(f"the inference role exited with code {self.process.returncode}")

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        def refuse(response: httpx.Response) -> InferenceUnavailable:
            return InferenceUnavailable(
                f"the inference role refused {method} {path} with HTTP {response.status_code}: {response.text[:300]}"
            )

        try:
            return request_json(
                self._client, method, path, body, attempts=ATTEMPTS, max_backoff=5.0, refuse=refuse,
                what="inference role", before_attempt=self._check_process,
            )
        except RetriesExhausted as error:
            self._check_process()
            raise InferenceUnavailable(f"the inference role at {self.base_url} failed {ATTEMPTS} times on {method} {path}: {error}") from None


def stop_process(process: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """SIGTERM a role's process group (it was started in a session of its own), SIGKILL after
    `timeout` seconds; nothing for None or a process that has exited."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def write_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], directory: pathlib.Path) -> None:
    """Write (name, tensor) pairs as `directory/model.safetensors` (CPU, contiguous), replacing
    the directory: the format `POST /update_weights` reads (docs/engine.md)."""
    from safetensors.torch import save_file

    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    save_file({name: tensor.detach().to("cpu").contiguous() for name, tensor in named_tensors}, str(directory / "model.safetensors"))


def start_inference_role(
    model_id: str, *, backend: str, workdir: pathlib.Path, startup_timeout: float = READY_TIMEOUT_S, max_lora_rank: int = 0,
) -> tuple[str, subprocess.Popen]:
    """Start `python -m engine inference` for `model_id` on a free loopback port, in its own
    process group; return (its base URL, the process). `max_lora_rank`: the rank of the
    adapters it will be sent (`--max-lora-rank`; 0: merged weights only). Raises
    InferenceUnavailable when it exits or prints no address within `startup_timeout` seconds."""
    log_path = workdir / "inference.log"
    workdir.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "w")  # noqa: SIM115 (the child writes to it for its whole life)
    process = subprocess.Popen(
        [sys.executable, "-m", "engine", "inference", "--model", model_id, "--backend", backend, "--host", "127.0.0.1",
         "--port", "0", "--workdir", str(workdir), *(["--max-lora-rank", str(max_lora_rank)] if max_lora_rank > 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env=child_environment(LAB_ENGINE_PARENT_PID=str(os.getpid())),  # it ends with this engine, even on kill -9
    )
    log.close()
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        found = re.search(r"serving .* on (http://\S+)", log_path.read_text(errors="replace"))
        if found:
            return found.group(1), process
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-500:]
            raise InferenceUnavailable(f"the inference role exited with code {process.returncode}: {tail}")
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    raise InferenceUnavailable(f"the inference role printed no address within {startup_timeout:.0f}s")
