"""Job secrets on the user's machine: read from ``-e KEY=VALUE``, ``--env-file FILE`` and a spec's
``env_files`` (or the older ``env_file``), as Prime's CLI reads them, to be sent as the create
body's write-only ``secrets``.

An env file has one ``KEY=VALUE`` per line (``export KEY=VALUE`` too); blank lines and lines
starting with ``#`` are skipped; a value in single quotes is taken as written, one in double
quotes or none has ``${NAME}`` replaced from this process's environment. A spec's files are
relative to the spec file. Later sources win: the spec's ``env_file``, its ``env_files``, then
``--env-file`` in order, then ``-e``. Nothing here sends anything.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

#: Most bytes of one env file, and of all secrets together (the server's limit).
MAX_SECRETS_BYTES = 64 * 1024
#: The spec keys that name env files, oldest spelling first.
SPEC_FILE_KEYS = ("env_file", "env_files")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class SecretsError(ValueError):
    """Secrets that cannot be read: a bad line, name or reference, a missing or oversized file."""


def _expand(value: str, where: str) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise SecretsError(f"{where}: ${{{name}}} is not set in this environment")
        return os.environ[name]

    return _REFERENCE.sub(replace, value)


def _unquote(value: str, where: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return _expand(value, where)


def _check_name(name: str, where: str) -> str:
    if not _NAME.match(name):
        raise SecretsError(f"{where}: '{name}' is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    return name


def read_env_file(path: str | Path) -> dict[str, str]:
    """Return the ``{name: value}`` pairs of the env file at ``path``.

    Raises :class:`SecretsError` for a file over :data:`MAX_SECRETS_BYTES`, a line without
    ``=``, a bad name or an unset ``${NAME}`` (naming the file and line, never a value), and
    ``OSError`` when the file cannot be read.
    """
    path = Path(path)
    with path.open("rb") as handle:
        raw = handle.read(MAX_SECRETS_BYTES + 1)
    if len(raw) > MAX_SECRETS_BYTES:
        raise SecretsError(f"{path}: a secrets file may hold at most {MAX_SECRETS_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretsError(f"{path}: not UTF-8 text") from None
    pairs: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        if "=" not in line:
            raise SecretsError(f"{where}: expected KEY=VALUE")
        name, _, value = line.partition("=")
        pairs[_check_name(name.strip(), where)] = _unquote(value.strip(), where)
    return pairs


def parse_env_argument(argument: str) -> dict[str, str]:
    """Return the pair of one ``-e`` argument: ``KEY=VALUE``, or ``KEY`` alone for this
    process's ``$KEY``. Raises :class:`SecretsError` for a bad name or an unset variable."""
    if "=" in argument:
        name, _, value = argument.partition("=")
        return {_check_name(name.strip(), "-e"): _unquote(value.strip(), f"-e {name.strip()}")}
    name = _check_name(argument.strip(), "-e")
    if name not in os.environ:
        raise SecretsError(f"-e {name}: {name} is not set in this environment (give -e {name}=VALUE)")
    return {name: os.environ[name]}


def spec_env_files(data: Mapping[str, Any], spec_path: str | Path) -> list[Path]:
    """Return the env files a decoded spec names (``env_file`` then ``env_files``; a string or a
    list of strings each), relative to the spec file's folder."""
    folder = Path(spec_path).parent
    files: list[Path] = []
    for key in SPEC_FILE_KEYS:
        value = data.get(key)
        for item in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
            if not isinstance(item, str):
                raise SecretsError(f"{key} must list file paths (strings)")
            files.append(folder / item)
    return files


def collect_secrets(
    *, env_files: Iterable[str | Path] = (), env_arguments: Iterable[str] = (),
) -> dict[str, str]:
    """Merge the pairs of ``env_files`` (in order) and then ``env_arguments`` (``-e``), later
    ones winning. Raises :class:`SecretsError` as the readers do, and when the secrets together
    are over :data:`MAX_SECRETS_BYTES`; ``OSError`` for an unreadable file."""
    secrets: dict[str, str] = {}
    for path in env_files:
        secrets.update(read_env_file(path))
    for argument in env_arguments:
        secrets.update(parse_env_argument(argument))
    size = sum(len(name) + len(value.encode("utf-8", "surrogatepass")) for name, value in secrets.items())
    if size > MAX_SECRETS_BYTES:
        raise SecretsError(f"the secrets are {size} bytes; the limit is {MAX_SECRETS_BYTES}")
    return secrets


def take_spec_secrets(
    data: MutableMapping[str, Any], spec_path: str | Path, *, env_files: Iterable[str | Path] = (),
    env_arguments: Iterable[str] = (),
) -> dict[str, str]:
    """Read the secrets of a decoded spec file and the command line, and remove the spec's
    ``env_file``/``env_files`` keys from ``data`` (paths on this machine, which Lab never reads).
    Returns the secrets (see :func:`collect_secrets` for the order and errors)."""
    files = spec_env_files(data, spec_path) + [Path(path) for path in env_files]
    for key in SPEC_FILE_KEYS:
        data.pop(key, None)
    return collect_secrets(env_files=files, env_arguments=env_arguments)
