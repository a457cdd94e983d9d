"""The demo program: start Lab, run the main job through the SDK, check and summarize it.

Everything after start-up goes through the public SDK (``labsdk``) and the REST API, the way a
user's own program would; only starting the processes and bootstrapping the tenant use
``manage.py``, as the README's set-up does.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shlex
import signal
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import labsdk
from labsdk import Lab, LabError
from labsdk.display import format_bytes, job_progress, status_order
from tqdm import tqdm

from engine.catalog import TINY_RANDOM_LLAMA_ID
from jobs.processes import ROOT, LabProcesses, port_is_free
from labsdk.webhooks import ReceivedWebhook, WebhookReceiver

SPEC_FILE = ROOT / "examples" / "addition-smollm2.toml"
REWARD_METRIC = "reward/mean"
#: Steps averaged at each end of the reward curve.
WINDOW = 5
#: How far the last steps' mean reward must lie above the first steps' to count as learning.
MIN_REWARD_GAIN = 0.1
#: Seconds to wait, after the job ends, for its webhooks to arrive.
WEBHOOK_WAIT_S = 60.0
ORGANIZATION, PROJECT, EMAIL = "demo", "demo", "demo@lab.localhost"
#: The receiver's path that the demo registers as its webhook endpoint.
WEBHOOK_PATH = "/webhooks"


class DemoError(Exception):
    """A step of the demo could not be done; the message says which and why."""


def _env_int(environ: dict[str, str], name: str, default: int | None, *, minimum: int) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise DemoError(f"{name} must be an integer, not {raw!r}") from None
    if value < minimum:
        raise DemoError(f"{name} must be at least {minimum}, not {value}")
    return value


@dataclass(frozen=True)
class DemoSettings:
    """What the demo runs, from ``DEMO_*`` variables (see :mod:`demo`)."""

    data_dir: Path
    model_dir: Path
    port: int
    model: str | None
    max_steps: int | None
    exit_when_done: bool
    timeout_s: int
    password: str
    spec_file: Path = SPEC_FILE

    @classmethod
    def from_environment(cls, environ: dict[str, str]) -> DemoSettings:
        """Read the settings; DemoError names a variable that cannot be used."""
        data_dir = Path(environ.get("LAB_DATA_DIR") or ROOT / "var").resolve()
        return cls(
            data_dir=data_dir,
            model_dir=Path(environ.get("LAB_MODEL_DIR") or data_dir / "models").resolve(),
            port=_env_int(environ, "DEMO_PORT", 8000, minimum=1),
            model=environ.get("DEMO_MODEL", "").strip() or None,
            max_steps=_env_int(environ, "DEMO_MAX_STEPS", None, minimum=1),
            exit_when_done=environ.get("DEMO_EXIT", "").strip().lower() in ("1", "true", "yes", "on"),
            timeout_s=_env_int(environ, "DEMO_TIMEOUT_S", 1800, minimum=1),
            password=environ.get("DEMO_PASSWORD") or secrets.token_urlsafe(12),
        )

    def process_environment(self, environ: dict[str, str]) -> dict[str, str]:
        """Return the environment of Lab's processes: the caller's, plus where data lives, how
        engines reach the server, and loopback webhooks allowed (the receiver is local)."""
        return {
            **environ,
            "LAB_DATA_DIR": str(self.data_dir),
            "LAB_MODEL_DIR": str(self.model_dir),
            "LAB_PUBLIC_URL": f"http://127.0.0.1:{self.port}",
            "LAB_WEBHOOK_ALLOW_PRIVATE": "1",
            "DJANGO_SETTINGS_MODULE": "lab.settings",
            "PYTHONUNBUFFERED": "1",
        }


@dataclass
class Check:
    """One line of the verdict: ``passed`` is None when the check does not apply to this run."""

    name: str
    passed: bool | None
    detail: str


@dataclass
class Outcome:
    """What the demo saw, for the summary."""

    job: labsdk.Job
    run_seconds: float
    rewards: dict[int, float] = field(default_factory=dict)
    checkpoint_dir: Path | None = None
    checks: list[Check] = field(default_factory=list)
    #: The inference backend the engine sampled with, from its perf/rollout_backend_vllm metric.
    rollout_backend: str = ""


def say(message: str = "") -> None:
    """Print one line of the demo's narration (stdout, flushed: it may be a pipe)."""
    print(message, flush=True)


def register_webhook_endpoint(*, base_url: str, api_key: str, url: str) -> dict[str, Any]:
    """Register ``url`` for every event type (``POST /api/v1/webhook-endpoints``); return the
    endpoint with its one-time ``secret``. DemoError with Lab's message when it is refused."""
    response = httpx.post(
        f"{base_url}/api/v1/webhook-endpoints",
        json={"url": url},
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=30,
    )
    if response.status_code != 201:
        raise DemoError(f"Lab refused the webhook endpoint ({response.status_code}): {response.text[:500]}")
    return response.json()


#: Seconds between the demo's reads of the job while it follows the stream: the stream carries
#: status changes and steps, a read also the queue place and the engine's phase (its heartbeat).
POLL_S = 2.0


def follow(lab: Lab, job: labsdk.Job, *, timeout_s: int) -> labsdk.Job:
    """Follow the job's live stream (``lab.jobs.stream``) with a progress bar of its steps, its
    status (a queued job's queue place and reason, a starting or running job's engine phase:
    ``labsdk.display.job_progress``, read every ``POLL_S`` seconds) and the latest
    ``reward/mean`` until it ends; return the finished job.

    DemoError when ``timeout_s`` seconds pass first.
    """

    def give_up(signum, frame) -> None:
        raise DemoError(f"{job.id} did not finish within {timeout_s} s (DEMO_TIMEOUT_S); it is {job.status}")

    bar = tqdm(total=job.max_steps, desc=job.id, unit="step", dynamic_ncols=True, file=sys.stdout)
    state = {"job": job, "step": 0, "reward": None, "shown": None}
    lock = threading.Lock()
    done = threading.Event()

    def show(*, status: labsdk.Job | None = None, step: int | None = None, reward: float | None = None) -> None:
        with lock:
            # The newest wins; a snapshot as new as the one shown (a replayed one, or the same
            # status read again) still brings the queue place and phase it was read with.
            if status is not None and status_order(status) >= status_order(state["job"]):
                state["job"] = status
            if step is not None:
                state["step"] = max(state["step"], step)
            if reward is not None:
                state["reward"] = reward
            postfix = job_progress(state["job"])
            if state["reward"] is not None:
                postfix["reward"] = f"{state['reward']:.3f}"
            shown = (state["step"], tuple(postfix.items()))
            if shown == state["shown"]:
                return
            state["shown"] = shown
            bar.n = state["step"]
            bar.set_postfix(postfix, refresh=False)
            bar.refresh()

    def poll() -> None:
        with Lab(api_key=lab.api_key, base_url=lab.base_url) as reader:  # a client of its own thread
            while not done.wait(POLL_S):
                try:
                    show(status=reader.jobs.retrieve(job.id))
                except LabError:
                    pass  # the stream is the source of truth; a missed read only delays the phase

    poller = threading.Thread(target=poll, name="demo-progress", daemon=True)
    previous_handler = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(timeout_s)
    poller.start()
    try:
        for event in lab.jobs.stream(job.id):
            if event.event == "status":
                show(status=event.data)
            elif event.event == "metrics":
                show(step=event.data.step, reward=event.data.values.get(REWARD_METRIC))
    finally:
        done.set()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous_handler)
        poller.join(timeout=POLL_S + 30)
        bar.close()
    return lab.jobs.retrieve(job.id)


#: The engine's per-step flag of which inference backend sampled (1.0: vLLM, 0.0: transformers).
BACKEND_METRIC = "perf/rollout_backend_vllm"


def rollout_backend(lab: Lab, job_id: str) -> str:
    """Return the inference backend the job's engine sampled with ("" when it reported none)."""
    flags = {point.values.get(BACKEND_METRIC) for point in lab.jobs.metrics(job_id, names=[BACKEND_METRIC])} - {None}
    return "" if not flags else ("vLLM" if flags == {1.0} else "transformers" if flags == {0.0} else "both")


def _backend_line(backend: str) -> str:
    if backend == "transformers":
        return ("transformers (Lab's default on CPU: faster end to end here than vLLM, whose start-up "
                "outweighs its faster sampling on a short job; LAB_ENGINE_ROLLOUT=vllm picks vLLM; docs/engine.md)")
    return backend or "not reported"


def reward_curve(lab: Lab, job_id: str) -> dict[int, float]:
    """Return ``reward/mean`` by step as stored by Lab."""
    return {
        point.step: point.values[REWARD_METRIC]
        for point in lab.jobs.metrics(job_id, names=[REWARD_METRIC])
        if point.values.get(REWARD_METRIC) is not None
    }


def check_learning(rewards: dict[int, float], *, model: str, max_steps: int) -> Check:
    """Compare the mean reward of the first and the last ``WINDOW`` steps.

    Not applicable to the tiny random model (it cannot learn) or to runs too short for two
    separate windows.
    """
    name = "reward went up"
    steps = sorted(rewards)
    if len(steps) < 2 * WINDOW:
        return Check(name, None, f"not checked: {len(steps)} steps with a reward, {2 * WINDOW} needed")
    first = statistics.fmean(rewards[step] for step in steps[:WINDOW])
    last = statistics.fmean(rewards[step] for step in steps[-WINDOW:])
    detail = (
        f"{first:.3f} over steps {steps[0]}-{steps[WINDOW - 1]}, "
        f"{last:.3f} over steps {steps[-WINDOW]}-{steps[-1]}"
    )
    if model == TINY_RANDOM_LLAMA_ID:
        return Check(name, None, f"not checked on {model}, which has random weights: {detail}")
    gained = last - first >= MIN_REWARD_GAIN
    return Check(name, gained, f"{detail} (at least +{MIN_REWARD_GAIN} needed)")


def load_with_peft(checkpoint_dir: Path, *, model: str, model_dir: Path) -> str:
    """Load a downloaded checkpoint on its base model with ``peft`` and run one forward pass;
    return a one-line description. Raises on a checkpoint that does not load."""
    import peft
    import torch

    from engine.models import load_model

    with warnings.catch_warnings():
        # transformers' deprecation notices from inside peft are not the user's to act on.
        warnings.simplefilter("ignore", FutureWarning)
        base, tokenizer = load_model(model, model_dir)
        loaded = peft.PeftModel.from_pretrained(base, str(checkpoint_dir))
    inputs = tokenizer("What is 12 + 7?", return_tensors="pt")
    with torch.no_grad():
        logits = loaded(**inputs).logits
    if not torch.isfinite(logits).all():
        raise ValueError("the loaded model's logits are not finite")
    adapters = sum(parameter.numel() for name, parameter in loaded.named_parameters() if "lora_" in name)
    return f"peft.PeftModel.from_pretrained on {model}: {adapters:,} LoRA parameters, forward pass finite"


def check_checkpoint(lab: Lab, job: labsdk.Job, settings: DemoSettings, outcome: Outcome) -> Check:
    """Download the job's final checkpoint through the SDK and load it with peft."""
    name = "final checkpoint loads with peft"
    checkpoint = job.latest_checkpoint
    if checkpoint is None or checkpoint.status != "ready":
        return Check(name, False, f"the job has no ready checkpoint (latest: {checkpoint and checkpoint.status})")
    if checkpoint.step != job.max_steps:
        return Check(
            name, False, f"the latest checkpoint is of step {checkpoint.step}, not the final step {job.max_steps}"
        )
    destination = settings.data_dir / "demo" / job.id / checkpoint.id
    try:
        say(f"Downloading {checkpoint.id} (step {checkpoint.step}, {format_bytes(checkpoint.size_bytes)}) ...")
        outcome.checkpoint_dir = lab.checkpoints.download(checkpoint.id, destination, extract=True, progress=True)
        say(f"Loading it on {job.spec['model']} with peft ...")
        line = load_with_peft(outcome.checkpoint_dir, model=job.spec["model"], model_dir=settings.model_dir)
    except Exception as exc:  # noqa: BLE001 (any failure to load is this check's verdict)
        return Check(name, False, f"{checkpoint.id}: {type(exc).__name__}: {exc}")
    size = format_bytes(checkpoint.size_bytes) if checkpoint.size_bytes else "size unknown"
    return Check(name, True, f"{checkpoint.id} (step {checkpoint.step}, {checkpoint.format}, {size}): {line}")


def _webhook_key(webhook: ReceivedWebhook) -> tuple[str | None, str | None]:
    data = (webhook.event or {}).get("data") or {}
    return webhook.type, data.get("checkpoint_id") if webhook.type == "checkpoint.ready" else None


def expected_webhooks(job: labsdk.Job) -> set[tuple[str, str | None]]:
    """Return the webhooks a finished job must have produced, as (type, checkpoint id) pairs:
    its terminal ``job.*`` event and ``checkpoint.ready`` of its final checkpoint."""
    expected: set[tuple[str, str | None]] = {(f"job.{job.status}", None)}
    if job.latest_checkpoint is not None:
        expected.add(("checkpoint.ready", job.latest_checkpoint.id))
    return expected


def check_webhooks(receiver: WebhookReceiver, job: labsdk.Job) -> Check:
    """Every webhook verified, and ``checkpoint.ready`` of the final checkpoint among them."""
    name = "webhooks verified, checkpoint.ready among them"
    expected = expected_webhooks(job)
    receiver.wait_for(lambda r: expected <= {_webhook_key(w) for w in r.unique()}, timeout=WEBHOOK_WAIT_S)
    received = receiver.unique()
    bad = [webhook for webhook in received if not webhook.verified]
    missing = sorted(f"{kind} {checkpoint or ''}".strip() for kind, checkpoint in
                     expected - {_webhook_key(webhook) for webhook in received})
    if bad:
        return Check(name, False, f"{len(bad)} of {len(received)} failed the signature check: {bad[0].error}")
    if missing:
        return Check(name, False, f"not received within {WEBHOOK_WAIT_S:.0f} s of the end: {', '.join(missing)}")
    return Check(
        name, True, f"{len(received)} received, {len(received)} signatures verified with labsdk.webhooks.verify"
    )


def check_usage(lab: Lab, job: labsdk.Job) -> tuple[Check, str]:
    """CPU-seconds recorded for the job in the billing ledger (``GET /usage``), the job's usage
    equal to the ledger's figure, and a cost that matches those seconds at the local ``cpu`` rate
    of the price table; return the check and a line for the summary."""
    name = "usage recorded and priced"
    usage = job.usage
    rate = next((price.usd_per_hour for price in lab.prices.list() if price.resource_type == "cpu"), None)
    ledger = lab.usage(group_by="job", job_id=job.id, start=job.created_at) if usage and usage.cpu_seconds else []
    if usage is None or not usage.cpu_seconds or usage.cost_usd is None or not ledger:
        return Check(name, False, f"no CPU-seconds or cost recorded: {usage}, ledger {ledger}"), ""
    if rate is None:
        return Check(name, False, "the price table has no local (cpu) rate"), ""
    row = ledger[0]
    expected = Decimal(str(row.cpu_seconds)) / 3600 * rate
    line = (
        f"{row.cpu_seconds:,.1f} CPU-seconds in the billing ledger at the local rate of ${rate} per hour: "
        f"${row.cost_usd} (the job shows ${usage.cost_usd})"
    )
    if row.cost_usd != usage.cost_usd or abs(row.cpu_seconds - usage.cpu_seconds) > 0.01:
        return Check(name, False, f"{line}, but the job's usage is not the ledger's"), line
    if abs(row.cost_usd - expected) > Decimal("0.00001"):  # rounded to the micro-dollar once per attempt
        return Check(name, False, f"{line}, but that rate gives ${expected:.6f}"), line
    return Check(name, True, line), line


def dashboard_url(base_url: str, job_id: str) -> str:
    """Return the job's page in the dashboard."""
    return f"{base_url}/o/{ORGANIZATION}/p/{PROJECT}/jobs/{job_id}/"


def export_line(*, api_key: str, base_url: str) -> str:
    """Return the shell line that points the ``lab`` CLI and the SDK at the demo's project, so
    that they show the same jobs as the dashboard login."""
    return f"export LAB_API_KEY={shlex.quote(api_key)} LAB_BASE_URL={shlex.quote(base_url)}"


def print_summary(outcome: Outcome, *, settings: DemoSettings, base_url: str, api_key: str,
                  receiver: WebhookReceiver, usage_line: str) -> None:
    """Print what the run did and one verdict line per check; where to look next (the job's
    page, the dashboard login, the CLI's settings) only when Lab keeps running after it (no
    ``DEMO_EXIT``): with it, Lab stops right after and they would lead nowhere."""
    job = outcome.job
    say()
    say(f"Job {job.id} ({job.spec.get('model')}, {job.max_steps} steps) {job.status} "
        f"{_duration(outcome.run_seconds)} after it was submitted.")
    if not settings.exit_when_done:
        say(f"  Dashboard   {dashboard_url(base_url, job.id)}")
        say(f"  Log in as   {EMAIL} / {settings.password}   ({base_url}/login/)")
        say(f"  CLI, SDK    {export_line(api_key=api_key, base_url=base_url)}")
    say(f"  Rewards     {_reward_line(outcome.rewards)}")
    say(f"  Rollouts    sampled with {_backend_line(outcome.rollout_backend)}")
    if outcome.checkpoint_dir is not None:
        say(f"  Checkpoint  {outcome.checkpoint_dir}")
    for webhook in receiver.unique():
        data = (webhook.event or {}).get("data") or {}
        about = f"step {data['step']}" if "step" in data and webhook.type == "checkpoint.ready" else ""
        verdict = "signature verified" if webhook.verified else f"signature REJECTED: {webhook.error}"
        say(f"  Webhook     {webhook.type or '?':<18} {about:<9} {verdict}")
    if usage_line:
        say(f"  Usage       {usage_line}")
    say()
    for check in outcome.checks:
        mark = {True: "PASS", False: "FAIL", None: "n/a "}[check.passed]
        say(f"  [{mark}] {check.name}: {check.detail}")


def _reward_line(rewards: dict[int, float]) -> str:
    steps = sorted(rewards)
    if not steps:
        return "none reported"
    first, last = steps[:WINDOW], steps[-WINDOW:]
    return (f"mean {REWARD_METRIC} {statistics.fmean(rewards[s] for s in first):.3f} over the first "
            f"{len(first)} steps, {statistics.fmean(rewards[s] for s in last):.3f} over the last {len(last)}")


def _duration(seconds: float) -> str:
    minutes, rest = divmod(math.ceil(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"


def start_lab(processes: LabProcesses, settings: DemoSettings, receiver: WebhookReceiver) -> Lab:
    """Migrate, bootstrap the demo tenant, start web, worker and beat, and register the webhook
    receiver; return an SDK client with the tenant's new API key."""
    began = time.monotonic()
    say(f"Lab demo: data in {settings.data_dir}, logs in {processes.log_dir}")
    say("Migrating the database ...")
    processes.migrate()
    tenant = processes.run(
        "manage.py", "bootstrap_tenant", "--org", ORGANIZATION, "--project", PROJECT,
        # One argument: a generated password may start with "-", which argparse takes for an option.
        "--email", EMAIL, f"--password={settings.password}", what="manage.py bootstrap_tenant",
    )
    api_key = _last_json_line(tenant)["api_key"]
    say(f"Starting web, worker and beat on {processes.base_url} ...")
    processes.start()
    url = receiver.url(WEBHOOK_PATH)
    say(f"Lab is up ({time.monotonic() - began:.1f} s). Registering the webhook receiver {url} ...")
    endpoint = register_webhook_endpoint(base_url=processes.base_url, api_key=api_key, url=url)
    receiver.expect(WEBHOOK_PATH, endpoint["secret"])
    return Lab(api_key=api_key, base_url=processes.base_url)


def judge(lab: Lab, job: labsdk.Job, *, settings: DemoSettings, receiver: WebhookReceiver, run_seconds: float):
    """Run every check on a finished job; return the Outcome and the usage line."""
    outcome = Outcome(job=job, run_seconds=run_seconds)
    error = f": {job.error.code}: {job.error.message}" if job.error else ""
    outcome.checks.append(Check("job succeeded", job.status == "succeeded", f"{job.status}{error}"))
    outcome.rewards = reward_curve(lab, job.id)
    outcome.rollout_backend = rollout_backend(lab, job.id)
    outcome.checks.append(check_learning(outcome.rewards, model=job.spec["model"], max_steps=job.max_steps))
    outcome.checks.append(check_checkpoint(lab, job, settings, outcome))
    outcome.checks.append(check_webhooks(receiver, job))
    usage_check, usage_line = check_usage(lab, lab.jobs.retrieve(job.id))
    outcome.checks.append(usage_check)
    return outcome, usage_line


def print_log_tail(lab: Lab, job_id: str, lines: int = 15) -> None:
    """Print the last ``lines`` lines the job's engine wrote (for a job that did not succeed)."""
    tail = [f"{line.stream}: {line.line}" for line in lab.jobs.logs(job_id, limit=100)][-lines:]
    say(f"The last {len(tail)} lines of {job_id}'s logs:")
    for line in tail:
        say(f"  {line}")


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def run(settings: DemoSettings, environ: dict[str, str]) -> int:
    """Run the demo; return the exit status: 0 when every check passed, 1 when one failed, 130
    when interrupted before the checks."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if not port_is_free(settings.port):
        raise DemoError(f"port {settings.port} is in use (another Lab?); choose another with DEMO_PORT")
    processes = LabProcesses(data_dir=settings.data_dir, port=settings.port, env=settings.process_environment(environ))
    receiver = WebhookReceiver().start()
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    lab: Lab | None = None
    job: labsdk.Job | None = None
    status = 130
    try:
        lab = start_lab(processes, settings, receiver)
        overrides: dict[str, Any] = {}
        if settings.model:
            overrides["model"] = settings.model
        if settings.max_steps:
            overrides["max_steps"] = settings.max_steps
        job = lab.jobs.create(spec_file=settings.spec_file, **overrides)
        submitted = time.monotonic()
        say(f"Submitted {job.id}: {job.spec['model']} on {job.spec['env'][0]['id']}, {job.max_steps} steps.")
        job = follow(lab, job, timeout_s=settings.timeout_s)
        outcome, usage_line = judge(
            lab, job, settings=settings, receiver=receiver, run_seconds=time.monotonic() - submitted
        )
        print_summary(outcome, settings=settings, base_url=processes.base_url, api_key=lab.api_key,
                      receiver=receiver, usage_line=usage_line)
        if job.status != "succeeded":
            print_log_tail(lab, job.id)
        failed = [check.name for check in outcome.checks if check.passed is False]
        status = 1 if failed else 0
        say()
        say(f"FAILED: {', '.join(failed)}." if failed else "Every check passed.")
        if settings.exit_when_done:
            return status
        say(f"Lab keeps running at {processes.base_url} for you to explore; Ctrl-C stops everything.")
        while True:
            processes.check_alive()
            time.sleep(1.0)
    except KeyboardInterrupt:
        say()
        say("Stopping ...")
        if lab is not None and job is not None:
            _cancel_if_running(lab, job.id)
        return status
    finally:
        # A second Ctrl-C must not cut the clean stop short and leave processes behind.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            processes.stop()
        finally:
            receiver.stop()
            if lab is not None:
                lab.close()


def _cancel_if_running(lab: Lab, job_id: str) -> None:
    """Cancel an unfinished job so a later start of Lab does not resume it, and give its engine
    a moment to stop after a checkpoint."""
    try:
        job = lab.jobs.retrieve(job_id)
        if job.is_terminal:
            return
        lab.jobs.cancel(job_id)
        deadline = time.monotonic() + 30
        while not job.is_terminal and time.monotonic() < deadline:
            time.sleep(0.5)
            job = lab.jobs.retrieve(job_id)
        say(f"{job_id} is {job.status}.")
    except LabError as exc:
        say(f"Could not cancel {job_id}: {exc}")


def _last_json_line(output: str) -> dict[str, Any]:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        raise DemoError(f"bootstrap_tenant printed no JSON line: {output[-500:]!r}") from None


def main() -> int:
    """Entry point of ``python -m demo``."""
    environ = dict(os.environ)
    try:
        settings = DemoSettings.from_environment(environ)
        return run(settings, environ)
    except (DemoError, RuntimeError, LabError) as exc:
        say(f"The demo stopped: {exc}")
        return 1
