"""The ``lab`` command line: jobs, spec checks and catalogues from a terminal or a script.

Tables for people; ``--json`` on every command for scripts. Lab is found through
``LAB_BASE_URL`` and ``LAB_API_KEY``. Exit status: 0 done, 1 refused or failed (the server's
message on stderr, never a traceback; ``jobs wait`` also when the job did not succeed),
2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from labsdk._version import __version__
from labsdk.client import Lab
from labsdk.display import MAIN_METRICS, format_bytes, progress_line, status_order
from labsdk.errors import (
    APIConnectionError,
    InvalidSpecError,
    JobCancelledError,
    JobFailedError,
    LabError,
    WaitTimeoutError,
)
from labsdk.secrets import SecretsError, take_spec_secrets
from labsdk.spec import SpecError, job_spec_json_schema, parse_spec, read_spec_file, secret_problems
from labsdk.spec_template import DEFAULT_ENV, DEFAULT_MODEL, spec_fields, spec_template
from labsdk.types import Job, LabObject

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130


def _print_json(data: Any) -> None:
    if isinstance(data, LabObject):
        data = data.to_dict()
    elif isinstance(data, list):
        data = [item.to_dict() if isinstance(item, LabObject) else item for item in data]
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _table(*columns: str, wrap: Sequence[str] = ()) -> Table:
    """A plain table for :func:`_print`. A column named in ``wrap`` (timestamps, sizes, names,
    prose) wraps between words on a narrow terminal, folding a word only when nothing else can
    give; every other column (ids, statuses, numbers) stays whole on one line."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column, no_wrap=column not in wrap, overflow="fold")
    return table


def _cell_text(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain


def _print(table: Table, console: Console | None = None) -> None:
    """Print ``table`` within the terminal's width: its one-line columns as wide as their widest
    cell, the wrapping ones sharing the rest, each wrapped between words and none folded while
    their longest words fit."""
    console = console or Console()
    columns = table.columns
    texts = [[_cell_text(column.header), *(_cell_text(cell) for cell in column.cells)] for column in columns]
    widest = [max(cell_len(line) for text in cells for line in text.splitlines() or [""]) for cells in texts]
    longest_word = [max((cell_len(word) for text in cells for word in text.split()), default=1) for cells in texts]
    for index, column in enumerate(columns):
        if column.no_wrap:
            column.min_width = widest[index]
    wrapping = [index for index, column in enumerate(columns) if not column.no_wrap]
    room = console.width - 2 * (len(columns) - 1) - sum(widest[i] for i in range(len(columns)) if i not in wrapping)
    if wrapping and sum(widest[i] for i in wrapping) > room:
        lowest = _water_fill(room, [longest_word[i] for i in wrapping])  # words whole while they fit
        widths = _water_fill(room - sum(lowest), [widest[i] - low for i, low in zip(wrapping, lowest)], even=False)
        for index, low, extra in zip(wrapping, lowest, widths):
            columns[index].max_width = max(4, low + extra)
    console.print(table)


def _water_fill(room: int, wants: Sequence[int], *, even: bool = True) -> list[int]:
    """Share ``room`` among columns that want ``wants``, none getting more than it wants and the
    total within ``room``: the smaller wants first, each (``even``) at most an even share of what
    is left, or else (``even=False``) whole while the room lasts."""
    given = [0] * len(wants)
    left = max(room, 0)
    for position, index in enumerate(sorted(range(len(wants)), key=lambda i: wants[i])):
        given[index] = min(wants[index], left // (len(wants) - position) if even else left)
        left -= given[index]
    return given


def _print_side_by_side(label: str, rows: Sequence[str], columns: Sequence[tuple[str, Sequence[str]]]) -> None:
    """Print ``columns`` (header, one value per row) beside a first column of ``rows`` headed
    ``label``, in as many tables as the terminal's width needs, each repeating the first column;
    no header or value is ever cut."""
    console = Console()
    width_of = [max(cell_len(header), *(cell_len(value) for value in values)) for header, values in columns]
    first = max(cell_len(label), *(cell_len(row) for row in rows))
    groups: list[list[int]] = [[]]
    used = first
    for index, width in enumerate(width_of):
        if groups[-1] and used + 2 + width > console.width:
            groups.append([])
            used = first
        groups[-1].append(index)
        used += 2 + width
    for number, group in enumerate(groups):
        if number:
            console.print()
        table = _table(label, *(columns[index][0] for index in group))
        for row, name in enumerate(rows):
            table.add_row(escape(name), *(escape(columns[index][1][row]) for index in group))
        _print(table, console)


def _text(value: Any) -> str:
    return "" if value is None else escape(str(value))


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else ""


def _progress(job: Job) -> str:
    if job.max_steps is None:
        return _text(job.step)
    return f"{job.step or 0}/{job.max_steps}"


def _show_job(console: Console, job: Job) -> None:
    table = _table("field", "value", wrap=("value",))
    table.show_header = False
    rows = [
        ("id", job.id),
        ("name", job.name),
        ("status", job.status + (f" ({job.status_reason})" if job.status_reason else "") if job.status else None),
        ("queue position", job.queue_position),
        ("step", _progress(job)),
        ("attempt", job.attempt),
        ("model", job.spec.get("model")),
        ("environments", ", ".join(env.get("id", "") for env in job.spec.get("env", []) if isinstance(env, dict))),
        ("created", _when(job.created_at)),
        ("started", _when(job.started_at)),
        ("finished", _when(job.finished_at)),
        ("error", job.error.code if job.error else None),
        ("usage", f"{job.usage.gpu_seconds or 0:g} GPU-s, {job.usage.cpu_seconds or 0:g} CPU-s, "
                  f"${job.usage.cost_usd if job.usage.cost_usd is not None else 0}" if job.usage else None),
        ("latest checkpoint", f"{job.latest_checkpoint.id} (step {job.latest_checkpoint.step})"
                              if job.latest_checkpoint else None),
        ("metadata", ", ".join(f"{k}={v}" for k, v in job.metadata.items()) or None),
    ]
    for name, value in rows:
        if value not in (None, ""):
            table.add_row(name, _text(value))
    _print(table, console)
    if job.error and job.error.message:  # whole, as plain lines: nothing folded or cut to copy it
        console.print(escape(job.error.message), soft_wrap=True)
    for warning in job.warnings:
        console.print(f"[yellow]warning:[/yellow] {escape(warning)}")


#: What to do about a problem, by its code, printed under it.
_HINTS = {
    "private_address": "Lab refuses loopback and private URLs unless it runs with LAB_WEBHOOK_ALLOW_PRIVATE=1 "
                       "(for a receiver on your own machine: restart `make up` with it set; docs/webhooks.md)",
}


def _report_problems(problems: Sequence[Any]) -> None:
    """Print one line per problem (a ``SpecProblem`` or an error body's ``ProblemDetail``), and
    the hint of each code that has one (``_HINTS``), once."""
    for problem in problems:
        code = f" [{problem.code}]" if problem.code else ""
        print(f"  {problem.param or '<spec>'}: {problem.message}{code}", file=sys.stderr)
    for code in dict.fromkeys(problem.code for problem in problems):
        if code in _HINTS:
            print(f"hint: {_HINTS[code]}", file=sys.stderr)


# --- commands: each takes the parsed arguments and a client factory, returns an exit status --

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
    for job in client().jobs.list(status=args.status, metadata=metadata or None, limit=min(args.limit, 100)):
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
    one plain line per status change and per metric step; with ``--json``: one JSON line per
    status record and metric step. Exit 1 unless the job succeeded."""
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
        header = Text("waiting for the job" if job is None else progress_line(job), style="bold")
        table = _table("METRIC", "STEP", "VALUE", wrap=("METRIC",))
        for name in sorted(latest):
            step, value = latest[name]
            table.add_row(escape(name), str(step), f"{value:.6g}")
        return Group(header, table)  # the header as wide as the terminal, not the table

    live = None if args.json or plain else Live(render(), console=console, auto_refresh=False)
    with live or contextlib.nullcontext():
        for event in client().jobs.stream(args.id):
            line_values: dict[str, float] | None = None
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
            else:
                continue
            if args.json:
                print(json.dumps({"event": event.event, "data": event.data.to_dict()}), flush=True)
            elif plain:
                job = current()
                if job is not None:
                    print(progress_line(job, line_values), flush=True)
            else:
                live.update(render(), refresh=True)
    return EXIT_OK if status is not None and status.status == "succeeded" else EXIT_FAILED


def jobs_checkpoints(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab jobs checkpoints ID``: a job's checkpoints."""
    checkpoints = list(client().jobs.checkpoints(args.id))
    if args.json:
        _print_json(checkpoints)
        return EXIT_OK
    table = _table("ID", "STEP", "ATTEMPT", "STATUS", "FORMAT", "SIZE", "CREATED", wrap=("CREATED",))
    for checkpoint in checkpoints:
        table.add_row(
            _text(checkpoint.id), _text(checkpoint.step), _text(checkpoint.attempt), _text(checkpoint.status),
            _text(checkpoint.format), format_bytes(checkpoint.size_bytes), _when(checkpoint.created_at),
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
    if args.json:
        _print_json(adapters)
        return EXIT_OK
    table = _table("ID", "STEP", "ATTEMPT", "STATUS", "FORMAT", "SIZE", "CREATED", wrap=("CREATED",))
    for adapter in adapters:
        table.add_row(
            _text(adapter.id), _text(adapter.step), _text(adapter.attempt), _text(adapter.status),
            _text(adapter.format), format_bytes(adapter.size_bytes), _when(adapter.created_at),
        )
    _print(table)
    return EXIT_OK


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


def _merge_problems(first: Sequence[Any], then: Sequence[Any]) -> list[Any]:
    """``first`` and the problems of ``then`` that ``first`` does not already name (the same
    ``param`` and ``code``), in that order."""
    seen = {(problem.param or "", problem.code) for problem in first}
    return [*first, *(problem for problem in then if (problem.param or "", problem.code) not in seen)]


def spec_check(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab spec check FILE [-e KEY=VALUE] [--env-file FILE]``: every problem in one run. The
    local ones (shape, cross-field rules, the secrets the spec names) are found here; with
    LAB_API_KEY the spec also goes to Lab's estimate whatever was found, and Lab's problems
    (model and environment catalogues, environment arguments and packages, the pool,
    ``init_from``) are merged in, each ``param``/``code`` once. Without a key it says that the
    catalogues were not checked. Exits 1 with any problem, and when Lab cannot be reached."""
    parsed, problems, secrets = None, [], {}
    try:
        data = read_spec_file(args.file)
    except SpecError as exc:  # not a table that could be sent anywhere
        return _spec_check_failed(args, exc.errors, None)
    try:
        if isinstance(data, dict):
            secrets = take_spec_secrets(data, args.file, env_files=args.env_file or [], env_arguments=args.env or [])
        parsed = parse_spec(data)
        problems = secret_problems(parsed.spec, secrets)
    except SpecError as exc:
        problems = list(exc.errors)

    estimate = None
    lab = None if not isinstance(data, dict) else "checked" if os.environ.get("LAB_API_KEY") else "no_key"
    if lab == "checked":
        try:
            estimate = client().jobs.estimate(spec=data, secrets=secrets)
        except InvalidSpecError as exc:
            problems = _merge_problems(problems, exc.errors)
        except APIConnectionError:
            if problems:
                _spec_check_failed(args, problems, "not_reached")
            elif not args.json:
                print(f"{args.file}: valid locally; Lab was not reached to check the catalogues and the pool")
            raise
    if problems:
        return _spec_check_failed(args, problems, lab)
    assert parsed is not None
    warnings = list(dict.fromkeys(parsed.warnings + (estimate.warnings if estimate else [])))
    if args.json:
        _print_json({"valid": True, "errors": [], "warnings": warnings,
                     "estimate": estimate.to_dict() if estimate else None, "checked_by_lab": estimate is not None})
        return EXIT_OK
    checked = "valid (checked locally and by Lab)" if estimate else (
        "valid locally; its model and environments were not checked (no LAB_API_KEY): "
        "set LAB_API_KEY to check them, and the pool, through Lab"
    )
    print(f"{args.file}: {checked}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if estimate:
        table = _table("estimate", "value", wrap=("value",))
        table.show_header = False
        for name, value in (
            ("GPU-seconds", estimate.gpu_seconds), ("CPU-seconds", estimate.cpu_seconds),
            ("cost (USD)", estimate.cost_usd), ("queue position", estimate.queue_position),
            ("can start now", estimate.can_start_now), ("reason", estimate.reason),
        ):
            if value is not None:
                table.add_row(name, _text(value))
        _print(table)
    return EXIT_OK


#: How ``lab spec check`` says whether Lab checked a spec with problems, by what happened.
_LAB_CHECK = {
    "checked": "checked locally and by Lab",
    "no_key": "its model and environments were not checked (no LAB_API_KEY): set LAB_API_KEY to check them through Lab",
    "not_reached": "its model and environments were not checked: Lab was not reached",
}


def _spec_check_failed(args: argparse.Namespace, problems: Sequence[Any], lab: str | None) -> int:
    """Report the problems ``lab spec check`` found (``SpecProblem``s or ``ProblemDetail``s) and
    whether Lab checked the spec too (``lab``: a key of ``_LAB_CHECK``, ``None`` for a file not
    read); return EXIT_FAILED."""
    if args.json:
        _print_json({"valid": False, "errors": [problem.to_dict() if hasattr(problem, "to_dict") else dict(problem)
                                                for problem in problems],
                     "warnings": [], "estimate": None, "checked_by_lab": lab == "checked"})
        return EXIT_FAILED
    count = len(problems)
    checked = f" ({_LAB_CHECK[lab]})" if lab else ""
    print(f"{args.file}: {count} problem{'' if count == 1 else 's'}{checked}", file=sys.stderr)
    _report_problems(problems)
    return EXIT_FAILED


def spec_init(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab spec init [FILE] [--model M] [--environment E] [--force]``: write a commented spec template
    (to stdout without FILE) that passes ``lab spec check`` as written."""
    text = spec_template(model=args.model, env=args.environment)
    if not args.file or args.file == "-":
        sys.stdout.write(text)
        return EXIT_OK
    if os.path.exists(args.file) and not args.force:
        raise _UsageError(f"{args.file} exists; pass --force to overwrite it")
    with open(args.file, "w", encoding="utf-8") as out:
        out.write(text)
    print(f"wrote {args.file}: check it with `lab spec check {args.file}`, "
          f"run it with `lab jobs create -f {args.file} --wait`", file=sys.stderr)
    return EXIT_OK


def spec_schema(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab spec schema [--fields]``: the job spec's JSON Schema (the one served at
    ``/api/v1/schema/job-spec.json``), or with ``--fields`` a table of every key."""
    if not args.fields:
        _print_json(job_spec_json_schema())
        return EXIT_OK
    fields = spec_fields()
    if args.json:
        _print_json([{"key": f.key, "type": f.type, "default": f.default, "required": f.required,
                      "meaning": f.meaning} for f in fields])
        return EXIT_OK
    table = _table("KEY", "TYPE", "DEFAULT", "MEANING", wrap=("TYPE", "DEFAULT", "MEANING"))
    for field in fields:
        default = "required" if field.required else ("" if field.default is None else json.dumps(field.default))
        table.add_row(_text(field.key), _text(field.type), _text(default), _text(field.meaning))
    _print(table)
    return EXIT_OK


def models(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab models``: the model catalogue."""
    found = client().models.list()
    if args.json:
        _print_json(found)
        return EXIT_OK
    table = _table("ID", "CONTEXT", "PARAMETERS", "DESCRIPTION", wrap=("DESCRIPTION",))
    for model in found:
        table.add_row(_text(model.id), _text(model.context_length), _text(model.parameters), _text(model.description))
    _print(table)
    return EXIT_OK


def _arguments(args: dict[str, Any] | None) -> str:
    """Return an environment's arguments as ``name=default`` words (values as JSON)."""
    return " ".join(f"{name}={json.dumps(value, ensure_ascii=False)}" for name, value in (args or {}).items())


def envs(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs [list]``: the built-in environments with their arguments and defaults, and the
    organization's uploaded packages with their versions and the day they were pushed (who
    pushed one: ``lab envs info``)."""
    found = client().environments.list()
    if args.json:
        _print_json(found)
        return EXIT_OK
    table = _table("ID", "KIND", "ARGS", "PUSHED", "DESCRIPTION", wrap=("ARGS", "DESCRIPTION"))
    for environment in found:
        table.add_row(_text(environment.id), _text(environment.kind), _text(_arguments(environment.args)),
                      f"{environment.created_at:%Y-%m-%d}" if environment.created_at else "",
                      _text(environment.description))
    _print(table)
    return EXIT_OK


def _print_environment(environment) -> None:
    for label, value in (
        ("id", environment.id), ("kind", environment.kind), ("version", environment.version),
        ("sha256", environment.sha256), ("size_bytes", environment.size_bytes),
        ("entry_point", environment.entry_point), ("verifiers", environment.verifiers_version),
        ("dependencies", ", ".join(environment.dependencies)), ("pushed_by", environment.pushed_by),
        ("created_at", environment.created_at.strftime("%Y-%m-%dT%H:%M:%SZ") if environment.created_at else None),
        ("description", environment.description),
        *_build_rows(environment.build),
    ):
        print(f"{label + ':':14}{'' if value is None else value}")


def _build_rows(build) -> list[tuple[str, Any]]:
    """``lab envs info``'s lines for the version's latest build: its status, then what loading it
    found (``load_environment``'s parameters with their defaults, the reward functions and weights)."""
    if build is None:
        return []
    finished = f" at {build.finished_at:%Y-%m-%dT%H:%M:%SZ}" if build.finished_at else ""
    parameters = ", ".join(
        f"{parameter['name']} ({parameter.get('type') or 'any'}, required)" if parameter.get("required")
        else f"{parameter['name']}={json.dumps(parameter.get('default'), ensure_ascii=False)} ({parameter.get('type') or 'any'})"
        for parameter in build.parameters
    )
    rewards = ", ".join(f"{function['name']} (weight {function.get('weight')})" for function in build.reward_functions)
    return [
        ("build", f"{build.number} {build.status}{finished}"),
        *([("build_error", build.error)] if build.error else []),
        *([("api", f"{build.api} ({build.environment_class})" if build.environment_class else build.api)] if build.api else []),
        *([("parameters", parameters)] if parameters else []),
        *([("rewards", rewards)] if rewards else []),
        *([("dataset_size", build.dataset_size)] if build.dataset_size is not None else []),
        *([("secrets", ", ".join(build.secrets))] if build.secrets else []),
    ]


def envs_push(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs push WHEEL``: upload an environment wheel for the organization; prints its id."""
    environment = client().environments.push(args.wheel)
    if args.json:
        _print_json(environment)
    else:
        print(environment.id)
    return EXIT_OK


def envs_info(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs info ID``: one package version (no version: the latest)."""
    environment = client().environments.retrieve(args.id)
    if args.json:
        _print_json(environment)
    else:
        _print_environment(environment)
    return EXIT_OK


def envs_build_log(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs build-log ID``: the log of the version's latest build (no version: the latest)."""
    text = client().environments.build_log(args.id)
    if not text:
        print(f"{args.id} has no build log yet: its build has not run (`lab envs info {args.id}`)", file=sys.stderr)
        return EXIT_OK
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def envs_rebuild(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs rebuild ID``: build the version again (same wheel, the package index as it is
    now); prints the new build. Refused while its latest build is queued or running."""
    lab = client()
    environment = lab.environments.retrieve(args.id)
    build = lab.environments.rebuild(environment.id)
    if args.json:
        _print_json(build)
    else:
        print(f"{environment.id}: build {build.number} {build.status} (follow it with `lab envs info {environment.id}`)")
    return EXIT_OK


def envs_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab envs delete ID``: delete one package version (no version: the latest); prints the
    exact version deleted. Refused while a queued or running job uses it."""
    lab = client()
    environment = lab.environments.retrieve(args.id)
    lab.environments.delete(environment.id)
    print(f"deleted {environment.id}")
    return EXIT_OK


def prices(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab prices``: the price table."""
    found = client().prices.list()
    if args.json:
        _print_json(found)
        return EXIT_OK
    table = _table("RESOURCE", "USD PER HOUR", "DESCRIPTION", wrap=("DESCRIPTION",))
    for price in found:
        table.add_row(_text(price.resource_type), _text(price.usd_per_hour), _text(price.description))
    _print(table)
    return EXIT_OK


def usage(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab usage [--start --end --group-by --job]``: the project's GPU/CPU-seconds and cost."""
    rows = client().usage(start=args.start, end=args.end, group_by=args.group_by, job_id=args.job)
    if args.json:
        _print_json(rows)
        return EXIT_OK
    keys = [key for key in ("date", "resource", "job_id") if any(getattr(row, key) is not None for row in rows)]
    table = _table(*[key.upper().replace("_", " ") for key in keys], "GPU-SECONDS", "CPU-SECONDS", "COST USD")
    for row in rows:
        table.add_row(*[_text(getattr(row, key)) for key in keys], f"{row.gpu_seconds or 0:.1f}",
                      f"{row.cpu_seconds or 0:.1f}", _text(row.cost_usd))
    _print(table)
    return EXIT_OK


def billing_balance(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab billing [balance]``: plan, balance, monthly spend limit and this month's spend."""
    balance = client().billing.balance()
    if args.json:
        _print_json(balance)
        return EXIT_OK
    limit = "none" if balance.spend_limit_usd is None else f"${balance.spend_limit_usd}"
    print(f"plan:             {balance.plan}" + ("" if balance.billing_enabled else " (billing off: nothing is charged)"))
    print(f"balance:          ${balance.balance_usd}")
    print(f"spent this month: ${balance.spent_this_month_usd} (limit {limit})")
    if balance.payment_failed:
        print("payment failed:   yes (new jobs are refused until it is paid)")
    return EXIT_OK


def webhooks_list(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks [list]``: the project's webhook endpoints, newest first."""
    endpoints = client().webhooks.list()
    if args.json:
        _print_json(endpoints)
        return EXIT_OK
    table = _table("ID", "URL", "ENABLED", "EVENTS", "CREATED", wrap=("URL", "EVENTS", "CREATED"))
    for endpoint in endpoints:
        table.add_row(_text(endpoint.id), _text(endpoint.url), "yes" if endpoint.enabled else "no",
                      _text(" ".join(endpoint.events)), _when(endpoint.created_at))
    _print(table)
    return EXIT_OK


def webhooks_create(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks create URL [--event TYPE ...]``: an endpoint; prints its id and its secret,
    which Lab shows this once."""
    endpoint = client().webhooks.create(args.url, events=args.event or None)
    if args.json:
        _print_json(endpoint)
        return EXIT_OK
    print(f"id:     {endpoint.id}")
    print(f"url:    {endpoint.url}")
    print(f"events: {', '.join(endpoint.events)}")
    print(f"secret: {endpoint.secret}")
    print("Keep the secret now (labsdk.webhooks.verify checks signatures with it): Lab never shows it again; "
          "`lab webhooks rotate-secret ID` makes a new one.", file=sys.stderr)
    return EXIT_OK


def webhooks_test(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks test ID``: send the endpoint a ``webhook.test`` event; prints the delivery."""
    delivery = client().webhooks.test(args.id)
    if args.json:
        _print_json(delivery)
    else:
        print(f"{delivery.id} {delivery.event_type} {delivery.status}: "
              f"`lab webhooks deliveries {args.id}` shows how it went")
    return EXIT_OK


def webhooks_deliveries(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks deliveries ID [--status S]``: an endpoint's deliveries, newest first, with
    the outcome of each one's latest try."""
    deliveries = client().webhooks.deliveries(args.id, status=args.status, limit=args.limit)[:args.limit]
    if args.json:
        _print_json(deliveries)
        return EXIT_OK
    table = _table("ID", "EVENT", "STATUS", "TRIES", "LAST TRY", "CREATED", wrap=("LAST TRY", "CREATED"))
    for delivery in deliveries:
        last = delivery.attempts[-1] if delivery.attempts else None
        outcome = "" if last is None else (str(last.status_code) if last.status_code else _text(last.error))
        table.add_row(_text(delivery.id), _text(delivery.event_type), _text(delivery.status),
                      _text(delivery.attempt_count), outcome, _when(delivery.created_at))
    _print(table)
    return EXIT_OK


def webhooks_rotate_secret(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks rotate-secret ID``: a new secret, printed once; the old one signs 24 h more."""
    endpoint = client().webhooks.rotate_secret(args.id)
    if args.json:
        _print_json(endpoint)
    else:
        print(endpoint.secret)
    return EXIT_OK


def webhooks_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab webhooks delete ID``: delete an endpoint."""
    client().webhooks.delete(args.id)
    if args.json:
        _print_json({"id": args.id, "deleted": True})
    else:
        print(f"{args.id} deleted")
    return EXIT_OK


def whoami(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab whoami``: the organization, project and scopes of the API key."""
    identity = client().whoami()
    if args.json:
        _print_json(identity)
        return EXIT_OK
    organization, project = identity.organization, identity.project
    print(f"organization: {organization.slug if organization else ''} ({organization.name if organization else ''})")
    print(f"project:      {project.slug if project else ''} ({project.name if project else ''})")
    print(f"scopes:       {', '.join(identity.scopes)}")
    return EXIT_OK


def _repeats_first_problem(exc: LabError) -> bool:
    """Whether the error's message only restates its first problem (Lab's ``invalid_spec``
    message is "<param>: <message> (and N more problems)"), which the problem list prints anyway."""
    if not exc.errors:
        return False
    first = exc.errors[0]
    said = f"{first.param}: {first.message}" if first.param else first.message
    return bool(first.message) and (exc.message.startswith(said) or exc.message.startswith(first.message))


def _add_secret_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-e", "--env", action="append", metavar="KEY[=VALUE]",
        help="a job secret (KEY alone reads $KEY here); repeatable; sent write-only, never shown again",
    )
    parser.add_argument(
        "--env-file", action="append", metavar="FILE",
        help="job secrets from a KEY=VALUE file, after the spec's env_files; repeatable",
    )


class _UsageError(Exception):
    """A command line the parser accepted but the command cannot use."""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {text!r}")
    return value


def _add_wait_options(parser: argparse.ArgumentParser, wait_help: str | None = None) -> None:
    if wait_help:
        parser.add_argument("--wait", action="store_true", help=wait_help)
    parser.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar while waiting")


def sandboxes_list(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes [list] [--label K=V ...]``: the project's sandboxes, newest first."""
    labels = dict(item.split("=", 1) for item in args.label or [])
    sandboxes = client().sandboxes.list(labels=labels or None)
    if args.json:
        _print_json(sandboxes)
        return EXIT_OK
    table = _table("ID", "NAME", "STATUS", "IMAGE", "LABELS", "CREATED", wrap=("LABELS", "CREATED"))
    for sandbox in sandboxes:
        table.add_row(_text(sandbox.id), _text(sandbox.name), _text(sandbox.status), _text(sandbox.image),
                      _text(" ".join(f"{key}={value}" for key, value in sandbox.labels.items())), _when(sandbox.created_at))
    _print(table)
    return EXIT_OK


def sandboxes_create(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes create [--image I] [--timeout S] [--label K=V ...]``: prints the new sandbox's id."""
    sandbox = client().sandboxes.create(
        image=args.image, name=args.name, cpu_cores=args.cpu, memory_gb=args.memory_gb, disk_gb=args.disk_gb,
        timeout_s=args.timeout, labels=dict(item.split("=", 1) for item in args.label or []) or None,
    )
    if args.json:
        _print_json(sandbox)
        return EXIT_OK
    for warning in sandbox.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(sandbox.id)
    return EXIT_OK


def sandboxes_get(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes get ID``: one sandbox."""
    sandbox = client().sandboxes.get(args.id)
    if args.json:
        _print_json(sandbox)
    else:
        print(f"{sandbox.id} {sandbox.status} {sandbox.image} cpu={sandbox.cpu_cores} memory={sandbox.memory_gb}GB "
              f"disk={sandbox.disk_gb}GB lifetime={sandbox.timeout_s}s created {_when(sandbox.created_at)}")
    return EXIT_OK


def sandboxes_delete(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes delete ID``: stop it and delete its files."""
    client().sandboxes.delete(args.id)
    print(f"{args.id} deleted")
    return EXIT_OK


def sandboxes_run(args: argparse.Namespace, client: Callable[[], Lab]) -> int:
    """``lab sandboxes run ID -- COMMAND ...``: run a command, print its output, exit with its exit code."""
    command = args.command_line[1:] if args.command_line[:1] == ["--"] else args.command_line
    result = client().sandboxes.run(args.id, command if len(command) > 1 else command[0], timeout_s=args.timeout)
    if args.json:
        _print_json(result)
        return EXIT_OK
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.timed_out:
        print(f"timed out after {args.timeout or 60} s", file=sys.stderr)
    return min(result.exit_code, 255)


def build_parser() -> argparse.ArgumentParser:
    """Return the ``lab`` argument parser; each command sets ``handler``."""
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")

    parser = argparse.ArgumentParser(prog="lab", description="Lab, hosted reinforcement learning, from the terminal.",
                                     epilog="Reads LAB_API_KEY and LAB_BASE_URL (default http://127.0.0.1:8000).")
    parser.add_argument("--version", action="version", version=f"labsdk {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    jobs = commands.add_parser("jobs", help="create, list, inspect, cancel and wait for jobs")
    job_commands = jobs.add_subparsers(dest="job_command", required=True, metavar="COMMAND")

    create = job_commands.add_parser("create", parents=[json_flag], help="submit a job from a spec file; prints its id")
    create.add_argument("-f", "--file", required=True, help="job spec, TOML (or JSON with a .json suffix)")
    create.add_argument("--name", help="job name, overriding the file's")
    _add_secret_options(create)
    _add_wait_options(create, "then wait for it to finish (exit 1 unless it succeeds)")
    create.set_defaults(handler=jobs_create)

    listing = job_commands.add_parser("list", parents=[json_flag], help="list jobs, newest first")
    listing.add_argument("--status", help="only jobs in this status (queued, running, succeeded, ...)")
    listing.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="only jobs with this metadata pair")
    listing.add_argument("--limit", type=_positive_int, default=20, help="most jobs shown (default 20)")
    listing.set_defaults(handler=jobs_list)

    for name, handler, help_text in (
        ("get", jobs_get, "show one job"),
        ("cancel", jobs_cancel, "cancel a job"),
        ("restart", jobs_restart, "run a failed or cancelled job again from its latest checkpoint"),
        ("delete", jobs_delete, "delete a finished job and its data"),
        ("events", jobs_events, "show a job's events"),
        ("checkpoints", jobs_checkpoints, "list a job's checkpoints"),
    ):
        command = job_commands.add_parser(name, parents=[json_flag], help=help_text)
        command.add_argument("id", help="job id (job_...)")
        command.set_defaults(handler=handler)

    logs = job_commands.add_parser("logs", parents=[json_flag], help="print a job's log lines")
    logs.add_argument("id", help="job id (job_...)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="follow the live stream until the job finishes (JSON lines with --json)")
    logs.set_defaults(handler=jobs_logs)

    watch = job_commands.add_parser("watch", parents=[json_flag],
                                    help="follow a job live: status and latest metrics, until it ends")
    watch.add_argument("id", help="job id (job_...)")
    watch.set_defaults(handler=jobs_watch)

    wait = job_commands.add_parser("wait", parents=[json_flag], help="wait for a job to finish, with a progress bar")
    wait.add_argument("id", help="job id (job_...)")
    _add_wait_options(wait)
    wait.set_defaults(handler=jobs_wait)

    metrics = job_commands.add_parser("metrics", parents=[json_flag], help="show a job's metrics per step")
    metrics.add_argument("id", help="job id (job_...)")
    chosen = metrics.add_mutually_exclusive_group()
    chosen.add_argument("--names", help=f"comma-separated metric names (default: {', '.join(MAIN_METRICS)})")
    chosen.add_argument("--all", action="store_true", help="every metric the job recorded")
    metrics.add_argument("--long", action="store_true", help="one row per step and metric (step, name, value)")
    metrics.set_defaults(handler=jobs_metrics)

    samples = job_commands.add_parser("samples", parents=[json_flag], help="show a job's rollout samples")
    samples.add_argument("id", help="job id (job_...)")
    samples.add_argument("--step", type=int, help="training step (default: the latest with samples)")
    samples.add_argument("--limit", type=_positive_int, default=20, help="most samples shown (default 20)")
    samples.add_argument("--prompt", action="store_true", help="show each sample's prompt too")
    samples.set_defaults(handler=jobs_samples)

    compare = job_commands.add_parser("compare", parents=[json_flag], help="jobs' final metrics side by side")
    compare.add_argument("ids", nargs="+", metavar="ID", help="job ids (job_...)")
    chosen = compare.add_mutually_exclusive_group()
    chosen.add_argument("--names", help=f"comma-separated metric names (default: {', '.join(MAIN_METRICS)})")
    chosen.add_argument("--all", action="store_true", help="every metric the jobs recorded")
    compare.set_defaults(handler=jobs_compare)

    distributions = job_commands.add_parser(
        "distributions", parents=[json_flag], help="histogram of one step's rollout rewards or advantages"
    )
    distributions.add_argument("id", help="job id (job_...)")
    distributions.add_argument("--step", type=int, help="training step (default: the latest with rollouts)")
    distributions.add_argument("--type", choices=("reward", "advantage"), default="reward", help="default: reward")
    distributions.add_argument("--bins", type=_positive_int, default=10, help="number of bins (default 10, at most 100)")
    distributions.set_defaults(handler=jobs_distributions)

    checkpoints = commands.add_parser("checkpoints", help="list and download checkpoints")
    checkpoint_commands = checkpoints.add_subparsers(dest="checkpoint_command", required=True, metavar="COMMAND")
    listing = checkpoint_commands.add_parser("list", parents=[json_flag], help="list a job's checkpoints, newest first")
    listing.add_argument("id", help="job id (job_...)")
    listing.set_defaults(handler=jobs_checkpoints)
    download = checkpoint_commands.add_parser(
        "download", parents=[json_flag], help="unpack a ready checkpoint into a directory (or save its tar with --tar)"
    )
    download.add_argument("id", help="checkpoint id (ckpt_...)")
    download.add_argument("-o", "--output", help="directory to unpack into (default ID/), or with --tar the file (default ID.tar)")
    download.add_argument("--tar", action="store_true", help="save the uncompressed tar archive instead of unpacking it")
    download.set_defaults(handler=checkpoints_download)

    adapters = commands.add_parser("adapters", help="list and download adapter artifacts ([adapters] in the spec)")
    adapter_commands = adapters.add_subparsers(dest="adapter_command", required=True, metavar="COMMAND")
    listing = adapter_commands.add_parser("list", parents=[json_flag], help="list a job's adapters, newest first")
    listing.add_argument("job", help="job id (job_...)")
    listing.set_defaults(handler=adapters_list)
    download = adapter_commands.add_parser(
        "download", parents=[json_flag], help="unpack a ready adapter into a directory, its SHA-256 checked"
    )
    download.add_argument("id", help="adapter id (adp_...)")
    download.add_argument("--dir", help="directory to unpack into (default ID/)")
    download.set_defaults(handler=adapters_download)

    spec = commands.add_parser(
        "spec", help="write, check and look up job spec files",
        epilog="Model ids: `lab models`; environment ids and their arguments: `lab envs`; "
               "every key: `lab spec schema --fields` (and docs/spec.md).",
    )
    spec_commands = spec.add_subparsers(dest="spec_command", required=True, metavar="COMMAND")
    init = spec_commands.add_parser(
        "init", help="write a commented spec template that passes `lab spec check` as written",
        epilog="Model ids: `lab models`; environment ids: `lab envs`.",
    )
    init.add_argument("file", nargs="?", help="where to write it (default: print it)")
    init.add_argument("--model", default=DEFAULT_MODEL, help=f"model catalogue id, see `lab models` (default {DEFAULT_MODEL})")
    init.add_argument("--environment", default=DEFAULT_ENV, metavar="ID",
                      help=f"environment id, see `lab envs` (default {DEFAULT_ENV})")
    init.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    init.set_defaults(handler=spec_init)
    schema = spec_commands.add_parser(
        "schema", parents=[json_flag],
        help="print the job spec's JSON Schema (also at /api/v1/schema/job-spec.json), or --fields a table of every key",
    )
    schema.add_argument("--fields", action="store_true", help="a table of every key: type, default, meaning")
    schema.set_defaults(handler=spec_schema)
    check = spec_commands.add_parser(
        "check", parents=[json_flag],
        help="validate a spec file locally, then through Lab's estimate when LAB_API_KEY is set",
    )
    check.add_argument("file", help="job spec, TOML (or JSON with a .json suffix)")
    _add_secret_options(check)
    check.set_defaults(handler=spec_check)

    usage_command = commands.add_parser("usage", parents=[json_flag], help="show the project's usage and cost")
    usage_command.add_argument("--start", help="from this date or ISO 8601 time (default 30 days ago)")
    usage_command.add_argument("--end", help="until this date or time, excluded (default now)")
    usage_command.add_argument("--group-by", default="day", help="day, resource, job, or several joined by commas")
    usage_command.add_argument("--job", help="only this job's usage")
    usage_command.set_defaults(handler=usage)
    billing = commands.add_parser("billing", parents=[json_flag], help="the organization's balance and spend",
                                  epilog="Without a command: the balance.")
    billing.set_defaults(handler=billing_balance)
    billing_commands = billing.add_subparsers(dest="billing_command", metavar="COMMAND")
    billing_commands.add_parser("balance", parents=[json_flag], help="plan, balance, spend limit and this month's spend").set_defaults(handler=billing_balance)

    for name, handler, help_text in (
        ("models", models, "list the models a job may train (a spec's `model`)"),
        ("prices", prices, "show the price table (USD per hour per GPU, or per CPU job)"),
        ("whoami", whoami, "show the organization, project and scopes of the API key"),
    ):
        commands.add_parser(name, parents=[json_flag], help=help_text).set_defaults(handler=handler)

    environments = commands.add_parser(
        "envs", parents=[json_flag], help="list, push, inspect and delete environments (a spec's `[[env]] id`)",
        epilog="Without a command: list. An id reads <organization>/<name>[@<version>]; no version means the latest.",
    )
    environments.set_defaults(handler=envs)
    env_commands = environments.add_subparsers(dest="env_command", metavar="COMMAND")
    env_commands.add_parser("list", parents=[json_flag], help="built-ins and the organization's packages").set_defaults(handler=envs)
    push = env_commands.add_parser("push", parents=[json_flag], help="upload an environment wheel (.whl, at most 100 MB)")
    push.add_argument("wheel", help="the wheel file, e.g. dist/my_env-0.1.0-py3-none-any.whl")
    push.set_defaults(handler=envs_push)
    info = env_commands.add_parser("info", parents=[json_flag], help="show one package version and its latest build")
    info.add_argument("id", help="<organization>/<name>[@<version>]")
    info.set_defaults(handler=envs_info)
    build_log = env_commands.add_parser("build-log", help="print the log of a package version's latest build")
    build_log.add_argument("id", help="<organization>/<name>[@<version>]")
    build_log.set_defaults(handler=envs_build_log)
    rebuild = env_commands.add_parser(
        "rebuild", parents=[json_flag], help="build a package version again against the package index as it is now",
    )
    rebuild.add_argument("id", help="<organization>/<name>[@<version>]")
    rebuild.set_defaults(handler=envs_rebuild)
    delete = env_commands.add_parser("delete", parents=[json_flag], help="delete one package version (never reused)")
    delete.add_argument("id", help="<organization>/<name>[@<version>]")
    delete.set_defaults(handler=envs_delete)

    sandboxes = commands.add_parser(
        "sandboxes", parents=[json_flag], help="isolated sandboxes: create, list, run commands, delete",
        epilog="Commands and files: docs/sandboxes.md; the SDK's lab.sandboxes also uploads and downloads files.",
    )
    sandboxes.set_defaults(handler=sandboxes_list, label=None)
    sandbox_commands = sandboxes.add_subparsers(dest="sandbox_command", metavar="COMMAND")
    listing = sandbox_commands.add_parser("list", parents=[json_flag], help="the project's sandboxes, newest first")
    listing.add_argument("--label", action="append", metavar="K=V", help="only those with this label (repeatable)")
    listing.set_defaults(handler=sandboxes_list)
    create = sandbox_commands.add_parser("create", parents=[json_flag], help="create a sandbox; prints its id")
    create.add_argument("--image", default="python:3.11", help="image (default python:3.11)")
    create.add_argument("--name", default="", help="a name for people")
    create.add_argument("--cpu", type=float, help="CPU cores")
    create.add_argument("--memory-gb", type=float, help="memory, GB")
    create.add_argument("--disk-gb", type=float, help="disk, GB")
    create.add_argument("--timeout", type=int, help="lifetime, seconds")
    create.add_argument("--label", action="append", metavar="K=V", help="a label (repeatable)")
    create.set_defaults(handler=sandboxes_create)
    for name, help_text, handler in (("get", "show one sandbox", sandboxes_get), ("delete", "stop a sandbox and delete its files", sandboxes_delete)):
        command = sandbox_commands.add_parser(name, parents=[json_flag], help=help_text)
        command.add_argument("id", help="sandbox id (sbx_...)")
        command.set_defaults(handler=handler)
    run = sandbox_commands.add_parser("run", parents=[json_flag], help="run a command in a sandbox; exits with its exit code")
    run.add_argument("id", help="sandbox id (sbx_...)")
    run.add_argument("--timeout", type=float, help="seconds before it is killed (default 60)")
    run.add_argument("command_line", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="the command (one string runs under sh -c)")
    run.set_defaults(handler=sandboxes_run)

    webhooks = commands.add_parser(
        "webhooks", parents=[json_flag], help="create, list, test and delete webhook endpoints",
        epilog="Without a command: list. Lab refuses loopback and private URLs unless it runs with "
               "LAB_WEBHOOK_ALLOW_PRIVATE=1 (local development; docs/webhooks.md).",
    )
    webhooks.set_defaults(handler=webhooks_list)
    webhook_commands = webhooks.add_subparsers(dest="webhook_command", metavar="COMMAND")
    webhook_commands.add_parser("list", parents=[json_flag], help="the project's endpoints").set_defaults(
        handler=webhooks_list)
    create = webhook_commands.add_parser(
        "create", parents=[json_flag], help="add an endpoint; prints its secret, shown this once",
    )
    create.add_argument("url", help="where Lab sends events (http or https)")
    create.add_argument("--event", action="append", metavar="TYPE",
                        help="an event type to send (job.succeeded, checkpoint.ready, ...); repeatable; "
                             "default every type")
    create.set_defaults(handler=webhooks_create)
    for name, handler, help_text in (
        ("test", webhooks_test, "send the endpoint a webhook.test event"),
        ("rotate-secret", webhooks_rotate_secret, "give the endpoint a new secret (the old one signs 24 h more)"),
        ("delete", webhooks_delete, "delete an endpoint"),
    ):
        command = webhook_commands.add_parser(name, parents=[json_flag], help=help_text)
        command.add_argument("id", help="endpoint id (whep_...)")
        command.set_defaults(handler=handler)
    deliveries = webhook_commands.add_parser(
        "deliveries", parents=[json_flag], help="an endpoint's deliveries, newest first, with their tries",
    )
    deliveries.add_argument("id", help="endpoint id (whep_...)")
    deliveries.add_argument("--status", choices=("pending", "succeeded", "failed"), help="only these")
    deliveries.add_argument("--limit", type=_positive_int, default=20, help="most deliveries shown (default 20)")
    deliveries.set_defaults(handler=webhooks_deliveries)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``lab`` command line with ``argv`` (default ``sys.argv[1:]``); return the
    exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    clients: list[Lab] = []

    def client() -> Lab:
        if not clients:
            clients.append(Lab())
        return clients[0]

    try:
        return args.handler(args, client)
    except LabError as exc:
        suffix = f" ({exc.code})" if exc.code else ""
        if _repeats_first_problem(exc):  # list each problem once, under a count
            count = len(exc.errors)
            print(f"error: {count} problem{'s' if count > 1 else ''}{suffix}", file=sys.stderr)
        else:
            print(f"error: {exc.message}{suffix}", file=sys.stderr)
        _report_problems(exc.errors)
        return EXIT_FAILED
    except SecretsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except _UsageError as exc:
        parser.error(str(exc))
    except OSError as exc:
        print(f"error: {exc.strerror or exc}: {exc.filename}" if exc.filename else f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        for opened in clients:
            opened.close()
