"""Options several ``lab`` commands share, and the usage error the parser reports."""

from __future__ import annotations

import argparse

from labsdk.errors import (
    LabError,
)


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


def _owner_and_name(text: str, form: str, listing: str) -> str:
    """``text`` when it reads ``<owner>/<name>...`` (both present, one slash), as the SDK's paths
    need; else ArgumentTypeError naming the form and the command that lists the ids."""
    owner, slash, name = text.partition("/")
    if not slash or not owner.strip() or not name.strip() or "/" in name:
        raise argparse.ArgumentTypeError(f"expected {form}, not {text!r}: `{listing}` lists them")
    return text


def _environment_id(text: str) -> str:
    """An environment id argument: ``<organization>/<name>[@<version>]`` (``lab/addition``,
    ``acme/my-env@0.1.0``); a bare name is a usage error, not the SDK's ValueError."""
    return _owner_and_name(text, "an id <organization>/<name>[@<version>], such as lab/addition or acme/my-env@0.1.0", "lab envs")


def _model_id(text: str) -> str:
    """A pushed model's id argument: ``<owner>/<name>``."""
    return _owner_and_name(text, "an id <owner>/<name>", "lab models")


def _dataset_name(text: str) -> str:
    """A pushed dataset's name argument: ``<owner>/<name>``."""
    return _owner_and_name(text, "a name <owner>/<name>", "lab datasets")


def _add_wait_options(parser: argparse.ArgumentParser, wait_help: str | None = None) -> None:
    if wait_help:
        parser.add_argument("--wait", action="store_true", help=wait_help)
    parser.add_argument("--timeout", type=float, help="give up waiting after this many seconds")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar while waiting")
