"""``lab jobs``, ``lab checkpoints`` and ``lab adapters``: submit, follow and control jobs, and
download what they wrote."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.text import Text

from labsdk.cli._options import _UsageError
from labsdk.cli._output import (
    EXIT_FAILED,
    EXIT_OK,
    _print,
    _print_json,
    _print_side_by_side,
    _progress,
    _show_job,
    _table,
    _text,
    _when,
)
from labsdk.client import Lab
from labsdk.display import MAIN_METRICS, format_bytes, learning_signal_note, progress_line, status_order
from labsdk.errors import (
    JobCancelledError,
    JobFailedError,
    WaitTimeoutError,
)
from labsdk.secrets import take_spec_secrets
from labsdk.spec import SpecError, read_spec_file
from labsdk.types import Job


def _spec_and_secrets(args: argparse.Namespace) -> tuple[dict | None, dict[str, str]]:
    """Read ``args.file`` and the job secrets of ``-e``/``--env-file`` and the spec's ``env_files``
    (``labsdk.secrets``), which leave the spec. A file that is not a readable table comes back as
    ``None``, for the SDK to report as it does; raises SecretsError or OSError for the secrets."""
    try:
        data = read_spec_file(args.file)
    except SpecError:
        data = None
    if not isinstance(data, dict):
        return None, take_spec_secrets({}, args.file, env_files=args.env_file or [], env_arguments=args.env or [])
    return data, take_spec_secrets(data, args.file, env_files=args.env_file or [], env_arguments=args.env or [])


def jobs_create(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs create -f FILE [--name NAME] [-e KEY=VALUE] [--env-file FILE]``: submit a job
    with its secrets and print its id."""
    fields = {"name": args.name} if args.name else {}
    data, secrets = _spec_and_secrets(args)
    source = {"spec": data} if data is not None else {"spec_file": args.file}
    job = client().jobs.create(**source, secrets=secrets, **fields)
    for warning in job.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not args.wait:
        if args.json:
            _print_json(job)
        else:
            print(job.id, flush=True)
        return EXIT_OK
    if not args.json:
        print(job.id, flush=True)
    return _wait_and_report(client(), job.id, args)


def jobs_metrics(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs metrics ID [--names a,b | --all] [--long]``: a job's metrics per step, by
    default the main ones (``labsdk.display.MAIN_METRICS``), one column each; ``--long`` one
    row per step and metric instead (step, name, value), which fits any terminal."""
    names = [name for name in (args.names or "").split(",") if name] or (None if args.all else list(MAIN_METRICS))
    points = list(client().jobs.metrics(args.id, names=names))
    if args.json:
        _print_json(points)
        return EXIT_OK
    if not points:
        print("no metrics yet", file=sys.stderr)
        return EXIT_OK
    present = {name for point in points for name in point.values}
    columns = [name for name in names if name in present] if names else sorted(present)
    if not columns:
        print(f"none of {', '.join(names)} recorded; --all shows every metric", file=sys.stderr)
        return EXIT_OK
    if args.long:
        table = _table("STEP", "NAME", "VALUE")
        for point in points:
            for name in columns:
                if point.values.get(name) is not None:
                    table.add_row(str(point.step), escape(name), f"{point.values[name]:.4g}")
        _print(table)
        return EXIT_OK
    _print_side_by_side("STEP", [str(point.step) for point in points], [
        (name, ["" if point.values.get(name) is None else f"{point.values[name]:.4g}" for point in points])
        for name in columns
    ])
    return EXIT_OK


def _final_values(points: Sequence[Any]) -> dict[str, tuple[int, float]]:
    """Return each metric's latest (step, value) among ``points`` (``MetricPoint``s, any order)."""
    final: dict[str, tuple[int, float]] = {}
    for point in points:
        for name, value in point.values.items():
            if value is not None and (name not in final or final[name][0] <= point.step):
                final[name] = (point.step, value)
    return final


def jobs_compare(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs compare JOB JOB... [--names a,b | --all]``: the jobs' final metrics side by
    side, one column per job (its latest value of each metric), under its name, status and step."""
    lab = client()
    names = [name for name in (args.names or "").split(",") if name] or (None if args.all else list(MAIN_METRICS))
    jobs = [lab.jobs.retrieve(job_id) for job_id in args.ids]
    finals = [_final_values(list(lab.jobs.metrics(job.id, names=names))) for job in jobs]
    present = {name for final in finals for name in final}
    shown = [name for name in names if name in present] if names else sorted(present)
    if args.json:
        _print_json([{"id": job.id, "name": job.name, "status": job.status, "step": job.step,
                      "final": {name: final[name][1] for name in shown if name in final}}
                     for job, final in zip(jobs, finals)])
        return EXIT_OK
    labels = ["name", "status", "step", *shown]
    _print_side_by_side("", labels, [
        (job.id, [job.name or "", job.status or "", _progress(job),
                  *("" if name not in final else f"{final[name][1]:.4g}" for name in shown)])
        for job, final in zip(jobs, finals)
    ])
    if not shown:
        print("no metrics recorded yet" if names is None else f"none of {', '.join(names)} recorded; --all shows every metric",
              file=sys.stderr)
    return EXIT_OK


def _as_text(value: Any) -> str:
    """Return a sample's prompt or completion as text: a string as it is, chat messages as
    ``role: content`` lines, anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        return "\n".join(f"{item.get('role', '')}: {item.get('content', '')}" for item in value)
    return "" if value is None else json.dumps(value, ensure_ascii=False)


def jobs_samples(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs samples ID [--step N] [--limit K] [--prompt]``: rollout samples (the latest
    step's unless ``--step``): step, group, reward, advantage and the completion (with ``--prompt``
    the prompt too)."""
    samples = client().jobs.samples(args.id, step=args.step, limit=args.limit)
    if args.json:
        _print_json(samples)
        return EXIT_OK
    if not samples:
        print("no rollout samples yet", file=sys.stderr)
        return EXIT_OK
    headers = ["STEP", "GROUP", "REWARD", "ADVANTAGE", *(["PROMPT"] if args.prompt else []), "COMPLETION"]
    table = _table(*headers, wrap=("PROMPT", "COMPLETION"))
    for sample in samples:
        number = (lambda value: "" if value is None else f"{value:.4g}")
        table.add_row(_text(sample.step), _text(sample.group), number(sample.reward), number(sample.advantage),
                      *([_text(_as_text(sample.prompt))] if args.prompt else []), _text(_as_text(sample.completion)))
    _print(table)
    return EXIT_OK


def jobs_distributions(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs distributions ID [--step N] [--type reward|advantage] [--bins K]``: a histogram
    of one step's rollout rewards or advantages, one row per bin with a bar."""
    found = client().jobs.distribution(args.id, step=args.step, type=args.type, bins=args.bins)
    if args.json:
        _print_json(found)
        return EXIT_OK
    if not found.count:
        print("no rollout samples yet", file=sys.stderr)
        return EXIT_OK
    print(f"{found.type} at step {found.step}: {found.count} rollouts, mean {found.mean:.4g}, "
          f"min {found.min:.4g}, max {found.max:.4g}")
    widest = max(item.count for item in found.bins) or 1
    table = _table("FROM", "TO", "COUNT", "", wrap=("",))
    for item in found.bins:
        table.add_row(f"{item.low:.4g}", f"{item.high:.4g}", str(item.count), "█" * round(30 * item.count / widest))
    _print(table)
    return EXIT_OK


def jobs_list(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs list``: the newest jobs, filtered by status and metadata."""
    metadata = {}
    for pair in args.metadata or []:
        key, separator, value = pair.partition("=")
        if not separator or not key:
            raise _UsageError(f"--metadata takes KEY=VALUE, not {pair!r}")
        metadata[key] = value
    jobs = []
    for job in client().jobs.list(
        status=args.status, metadata=metadata or None, kind=args.kind, limit=min(args.limit, 100)
    ):
        jobs.append(job)
        if len(jobs) >= args.limit:
            break
    if args.json:
        _print_json(jobs)
        return EXIT_OK
    table = _table("ID", "NAME", "STATUS", "STEP", "CREATED", wrap=("NAME", "CREATED"))
    for job in jobs:
        table.add_row(_text(job.id), _text(job.name), _text(job.status), _progress(job), _when(job.created_at))
    _print(table)
    return EXIT_OK


def jobs_get(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs get ID``: one job in detail."""
    job = client().jobs.retrieve(args.id)
    if args.json:
        _print_json(job)
    else:
        _show_job(Console(), job)
    return EXIT_OK


def jobs_cancel(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs cancel ID``: cancel a job and print its new status."""
    job = client().jobs.cancel(args.id)
    if args.json:
        _print_json(job)
    else:
        print(f"{job.id} {job.status}")
    return EXIT_OK


def jobs_restart(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs restart ID``: run a failed or cancelled job again; prints the attempt it queues
    (Lab counts an attempt when it starts) and where it resumes."""
    job = client().jobs.restart(args.id)
    if args.json:
        _print_json(job)
    else:
        start = f"from {job.latest_checkpoint.id} (step {job.latest_checkpoint.step})" if job.latest_checkpoint \
            else "from the start"
        print(f"{job.id} {job.status}: attempt {(job.attempt or 0) + 1} will run {start}")
    return EXIT_OK


def jobs_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs delete ID``: delete a finished job and its data."""
    client().jobs.delete(args.id)
    if args.json:
        _print_json({"id": args.id, "deleted": True})
    else:
        print(f"{args.id} deleted")
    return EXIT_OK


def jobs_logs(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs logs ID [--follow]``: a job's log lines, or its live log until it ends."""
    if args.follow:
        for event in client().jobs.stream(args.id):
            if event.event == "log":
                print(json.dumps(event.data.to_dict()) if args.json else event.data.line, flush=True)
        return EXIT_OK
    lines = client().jobs.logs(args.id)
    if args.json:
        _print_json(list(lines))
        return EXIT_OK
    for line in lines:
        print(line.line)
    return EXIT_OK


def jobs_watch(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs watch ID``: a live table of the job's status and latest metric values, until it
    ends. The header follows the newest status and step. Without a terminal (a pipe, a log file):
    one plain line per status change and per metric step (a step's line labelled with that step,
    replayed or not, ending in :data:`labsdk.display.NO_LEARNING_SIGNAL` when every group of the
    step had the same reward); with ``--json``: one JSON line per status record and metric step.
    A failed job's error (code and message, as ``lab jobs get`` shows them) goes to stderr. Exit 1
    unless the job succeeded."""
    status: Job | None = None
    latest: dict[str, tuple[int, float]] = {}
    newest_step = 0
    console = Console()
    plain = not args.json and not console.is_terminal

    def current() -> Job | None:
        if status is None:
            return None
        return status.model_copy(update={"step": max(status.step or 0, newest_step)})

    def render() -> Group:
        job = current()
        newest = {name: value for name, (step, value) in latest.items() if step == newest_step}
        header = Text("waiting for the job" if job is None else progress_line(job) + learning_signal_note(newest),
                      style="bold")
        table = _table("METRIC", "STEP", "VALUE", wrap=("METRIC",))
        for name in sorted(latest):
            step, value = latest[name]
            table.add_row(escape(name), str(step), f"{value:.6g}")
        return Group(header, table)  # the header as wide as the terminal, not the table

    live = None if args.json or plain else Live(render(), console=console, auto_refresh=False)
    with live or contextlib.nullcontext():
        for event in client().jobs.stream(args.id):
            line_values: dict[str, float] | None = None
            line_step: int | None = None
            line_note = ""
            if event.event == "status":
                if status is not None and status_order(event.data) <= status_order(status):
                    continue  # an older status replayed after the opening snapshot, or the same one
                status = event.data
            elif event.event == "metrics":
                for name, value in event.data.values.items():
                    if name not in latest or latest[name][0] <= event.data.step:
                        latest[name] = (event.data.step, value)
                newest_step = max(newest_step, event.data.step)
                line_values = {name: event.data.values[name] for name in MAIN_METRICS if name in event.data.values}
                line_step = event.data.step
                line_note = learning_signal_note(event.data.values)
            else:
                continue
            if args.json:
                print(json.dumps({"event": event.event, "data": event.data.to_dict()}), flush=True)
            elif plain:
                job = current()
                if job is not None:
                    if line_step is not None:  # a replayed step is labelled with its own step, not the newest
                        job = job.model_copy(update={"step": line_step})
                    print(progress_line(job, line_values) + line_note, flush=True)
            else:
                live.update(render(), refresh=True)
    if status is not None and status.status == "failed" and not args.json:
        failed = status if status.error else client().jobs.retrieve(args.id)
        print(f"error: {JobFailedError(failed)}", file=sys.stderr)
    return EXIT_OK if status is not None and status.status == "succeeded" else EXIT_FAILED


def jobs_checkpoints(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs checkpoints ID``: a job's checkpoints."""
    checkpoints = list(client().jobs.checkpoints(args.id))
    return _print_artifacts(checkpoints, as_json=args.json)


def _print_artifacts(artifacts: Sequence[Any], *, as_json: bool) -> int:
    """Print a job's checkpoints or adapters (they share their fields) as a table, or as JSON."""
    if as_json:
        _print_json(artifacts)
        return EXIT_OK
    table = _table("ID", "STEP", "ATTEMPT", "STATUS", "FORMAT", "SIZE", "CREATED", wrap=("CREATED",))
    for artifact in artifacts:
        table.add_row(
            _text(artifact.id), _text(artifact.step), _text(artifact.attempt), _text(artifact.status),
            _text(artifact.format), format_bytes(artifact.size_bytes), _when(artifact.created_at),
        )
    _print(table)
    return EXIT_OK


def checkpoints_download(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab checkpoints download ID [-o PATH] [--tar]``: unpack a checkpoint into a directory
    (default ``ID/``), or with ``--tar`` save its archive (default ``ID.tar``)."""
    destination = args.output or (f"{args.id}.tar" if args.tar else args.id)
    try:
        saved = client().checkpoints.download(args.id, destination, extract=not args.tar, progress=not args.json)
    except ValueError as exc:  # the destination is a file or a non-empty directory
        raise _UsageError(str(exc)) from None
    if args.json:
        _print_json({"id": args.id, "path": str(saved), "extracted": not args.tar})
    else:
        print(saved)
    return EXIT_OK


def adapters_list(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab adapters list JOB``: a job's adapter artifacts, newest first."""
    adapters = client().adapters.list(args.job)
    return _print_artifacts(adapters, as_json=args.json)


def adapters_download(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab adapters download ID [--dir DIR]``: unpack a ready adapter (SHA-256 checked) into
    ``DIR`` (default ``ID/``) and print where it is."""
    destination = args.dir or args.id
    try:
        saved = client().adapters.download(args.id, destination, progress=not args.json)
    except ValueError as exc:  # the destination is a file or a non-empty directory
        raise _UsageError(str(exc)) from None
    if args.json:
        _print_json({"id": args.id, "path": str(saved)})
    else:
        print(saved)
    return EXIT_OK


def jobs_events(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs events ID``: a job's history."""
    events = list(client().jobs.events(args.id))
    if args.json:
        _print_json(events)
        return EXIT_OK
    table = _table("TIME", "LEVEL", "TYPE", "MESSAGE", wrap=("TIME", "MESSAGE"))
    for event in events:
        table.add_row(_when(event.created_at), _text(event.level), _text(event.type), _text(event.message))
    _print(table)
    return EXIT_OK


def jobs_wait(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs wait ID``: wait with a progress bar; exit 1 unless the job succeeded."""
    return _wait_and_report(client(), args.id, args)


def _wait_and_report(lab: Lab, job_id: str, args: argparse.Namespace) -> int:
    try:
        job = lab.jobs.wait(job_id, timeout=args.timeout, progress=not args.no_progress and not args.json)
    except (JobFailedError, JobCancelledError, WaitTimeoutError) as exc:
        if args.json:
            _print_json(exc.job)
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        _print_json(job)
    else:
        print(f"{job.id} {job.status}")
    return EXIT_OK
