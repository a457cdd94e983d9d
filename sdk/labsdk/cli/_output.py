"""What every ``lab`` command prints with: tables that fit the terminal, JSON for scripts, a
job's summary, problems by path, and the exit statuses."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

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
    their longest words fit. Into a pipe or a file with no ``COLUMNS`` set, no width bounds it:
    every row is whole on one line, for ``grep`` and ``cut`` (``COLUMNS`` fits it to that width)."""
    console = console or Console()
    columns = table.columns
    texts = [[_cell_text(column.header), *(_cell_text(cell) for cell in column.cells)] for column in columns]
    widest = [max(cell_len(line) for text in cells for line in text.splitlines() or [""]) for cells in texts]
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        natural = sum(widest) + 2 * (len(columns) - 1)
        console = Console(file=console.file, width=max(console.width, natural), no_color=console.no_color)
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


_ENGINE_EGRESS_HINT = ("Lab refuses an endpoint on a loopback or private address for its engines unless it runs with "
                       "LAB_ENGINE_EGRESS_ALLOW_PRIVATE=1 (docs/evaluations.md)")
#: What to do about a problem, by its code and param, printed under it.
_HINTS = {
    ("private_address", "url"): "Lab refuses loopback and private URLs unless it runs with LAB_WEBHOOK_ALLOW_PRIVATE=1 "
                                "(for a receiver on your own machine: restart `make up` with it set; docs/webhooks.md)",
    ("private_address", "model.base_url"): _ENGINE_EGRESS_HINT,
    ("private_address", "eval.endpoint.base_url"): _ENGINE_EGRESS_HINT,
}


def _report_problems(problems: Sequence[Any]) -> None:
    """Print one line per problem (a ``SpecProblem`` or an error body's ``ProblemDetail``), and
    the hint of each code and param that has one (``_HINTS``), once."""
    for problem in problems:
        code = f" [{problem.code}]" if problem.code else ""
        print(f"  {problem.param or '<spec>'}: {problem.message}{code}", file=sys.stderr)
    for key in dict.fromkeys((problem.code, problem.param) for problem in problems):
        if key in _HINTS:
            print(f"hint: {_HINTS[key]}", file=sys.stderr)
