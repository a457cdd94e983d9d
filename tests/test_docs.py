"""The repository's docs stand alone: every relative link in the README, CONTRIBUTING.md and
docs/ resolves to a file of the repository (none points outside it), the README links every
docs page, and no page or example spec sends the reader to design notes outside the clone."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Markdown links and images: ``[text](target)`` and ``![alt](target)``; the target ends at the
#: first space (an optional title follows) or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: Where the design notes lived before docs/ held them; a clone of the repository has neither.
OUTSIDE = re.compile(r"\.\./shared/|shared/DESIGN\.md|\bDESIGN\.md\b")


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def _user_facing_files() -> list[Path]:
    """The README, CONTRIBUTING.md, docs/ and the example specs: what a clone's reader opens."""
    return [*_pages(), *sorted((ROOT / "examples").glob("*.toml"))]


def relative_links(page: Path) -> list[str]:
    """Return the link targets of ``page`` that are paths, not URLs or in-page anchors."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    targets = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        targets.append(target.split("#", 1)[0])
    return targets


def test_it_finds_the_links_of_a_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "See [a](docs/a.md), [b](b.md#part \"title\"), ![img](img/x.png), [web](https://x.org/y),\n"
        "[here](#top) and [mail](mailto:a@b.c).\n```\n[not](in-code.md)\n```\n"
    )
    assert relative_links(page) == ["docs/a.md", "b.md", "img/x.png"]


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_it_resolves_every_relative_link_inside_the_repository(page):
    problems = []
    for target in relative_links(page):
        resolved = (page.parent / target).resolve()
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
    assert problems == [], f"{page.relative_to(ROOT)}: " + "; ".join(problems)


def test_it_links_every_docs_page_from_the_readme():
    linked = {(ROOT / target).resolve() for target in relative_links(ROOT / "README.md")}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert unlinked == []


def test_no_page_or_example_points_to_design_notes_outside_the_repository():
    hits = []
    for path in _user_facing_files():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert hits == [], "\n".join(hits)


# --- paths and commands named in the text -----------------------------------------------------

#: A repository path named in prose or code: under a top-level directory of the repository, and
#: a file (with a suffix) or a directory (ending in "/"); ``lab/addition``, an environment id, is
#: neither. Not preceded by a path character (``/tmp/x/docs/a.md``, URLs) and free of
#: placeholders (``<org>``, ``...``, ``{a,b}``, ``*``).
NAMED_PATH = re.compile(r"(?<![\w/.$-])((?:[\w.-]+/)+(?:[\w-]+\.[A-Za-z]\w*)?)(?![\w/<{*])")
_TOP_LEVEL = {path.name for path in ROOT.iterdir() if path.is_dir() and not path.name.startswith((".venv", "var"))}
#: Files whose prose names repository paths: the pages, the example specs and the example packages'
#: pyproject.toml.
def _naming_files() -> list[Path]:
    return [*_pages(), *sorted((ROOT / "examples").rglob("*.toml"))]


def named_paths(text: str) -> list[str]:
    """Return the repository paths ``text`` names (see ``NAMED_PATH``), in order."""
    found = []
    for match in NAMED_PATH.finditer(text):
        path = match.group(1)
        if path.split("/", 1)[0] in _TOP_LEVEL and (path.endswith("/") or "." in path.rsplit("/", 1)[-1]):
            found.append(path)
    return found


def test_it_finds_the_paths_a_text_names():
    text = ("See `jobs/webhooks/events.py`, docs/spec.md and demo/; not lab/addition, /tmp/x/docs/a.md,\n"
            "http://host/docs/b.md, examples/<org>/x.toml, LAB_DATA_DIR/logs/web.log or dist/x.whl.")
    assert named_paths(text) == ["jobs/webhooks/events.py", "docs/spec.md", "demo/"]


@pytest.mark.parametrize("path", _naming_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_doc_or_example_names_exists(path):
    text = path.read_text()
    missing = sorted({named for named in named_paths(text) if not (ROOT / named).exists()})
    # An example package's comments may name a path relative to the package.
    missing = [named for named in missing if not (path.parent / named).exists()]
    assert missing == [], f"{path.relative_to(ROOT)} names paths that do not exist: {missing}"


def _readme_commands(program: str, *, inline: bool = True) -> list[str]:
    """Return every command line of the README that runs ``program`` (``lab`` or ``make``), from
    its code blocks and (``inline``) its inline code, which may name a command without its
    arguments; without comments, the ``.venv/bin/`` prefix and variable assignments before it;
    one per command of a ``&&``/``;``/``|`` chain."""
    text = (ROOT / "README.md").read_text()
    spans = [line for block in re.findall(r"```\w*\n(.*?)```", text, flags=re.S) for line in block.splitlines()]
    if inline:
        spans += re.findall(r"(?<!`)`([^`\n]+)`(?!`)", re.sub(r"```.*?```", "", text, flags=re.S))
    commands = []
    for span in spans:
        for part in re.split(r"&&|;|\|", span.split(" #", 1)[0]):
            words = part.strip().split()
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words.pop(0)
            if words and words[0] in (program, f".venv/bin/{program}"):
                commands.append(" ".join([program, *words[1:]]))
    return commands


def test_the_readme_names_lab_and_make_commands():
    assert "lab webhooks create URL --event TYPE" in [c.replace("[", "").replace("]", "") for c in _readme_commands("lab")]
    assert "make demo" in _readme_commands("make")


@pytest.mark.parametrize("command", sorted(set(_readme_commands("lab"))))
def test_every_lab_command_of_the_readme_parses_and_has_help(command, capsys):
    """A command line of a code block parses as written (placeholders as values); every one,
    inline mentions included, has its ``--help``."""
    from labsdk.cli import build_parser

    words = shlex.split(command.replace("[", " ").replace("]", " "))[1:]
    if command in _readme_commands("lab", inline=False):
        try:
            build_parser().parse_args(words)
        except SystemExit as exc:
            pytest.fail(f"`{command}` does not parse: exit {exc.code}: {capsys.readouterr().err.strip()}")
    subcommand = [word for word in words[:2] if not word.startswith("-")]
    with pytest.raises(SystemExit) as shown:
        build_parser().parse_args([*subcommand, "--help"])
    assert shown.value.code == 0 and "usage: lab" in capsys.readouterr().out


def test_every_make_target_of_the_readme_is_in_the_makefile():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, flags=re.M))
    named = {word for command in _readme_commands("make") for word in command.split()[1:] if not word.startswith("-")}
    assert named and named - targets == set()


def test_the_configuration_page_names_every_variable_the_settings_read():
    """docs/configuration.md says it lists every variable Lab reads: each LAB_* that lab/settings.py
    or lab/config.py names is in it."""
    read = set()
    for module in ("lab/settings.py", "lab/config.py"):
        read |= set(re.findall(r"[\"'](LAB_[A-Z0-9_]+)[\"']", (ROOT / module).read_text()))
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert read and sorted(name for name in read if f"`{name}`" not in page) == []


def test_the_readme_says_how_make_up_builds_environments_offline():
    """`make up`'s section names the package index builds resolve against, its default (the
    settings'), and the local index `make package-index` fills, at the path the Makefile fills."""
    section = (ROOT / "README.md").read_text().split("## Using it", 1)[1].split("\n## ", 1)[0]
    default = re.search(r'env_str\("LAB_PACKAGE_INDEX_URL", "([^"]+)"\)', (ROOT / "lab" / "settings.py").read_text())
    assert default and f"`LAB_PACKAGE_INDEX_URL` (default `{default.group(1)}`" in " ".join(section.split())
    assert "`make package-index` fills `var/package-index`" in " ".join(section.split())
    assert "PACKAGE_INDEX ?= var/package-index" in (ROOT / "Makefile").read_text()
    assert "`LAB_PACKAGE_INDEX_URL=file://$PWD/var/package-index/simple make up`" in section
    assert "make package-index" in _readme_commands("make") and "make up" in _readme_commands("make")


def test_the_spec_and_the_environments_page_give_the_episode_limits_to_both_apis():
    """`[[env]]` `max_turns`, `max_input_tokens` and `max_output_tokens` bound v0 `MultiTurnEnv`s
    too (tests/environments/test_load_environment_multi_turn.py): docs/spec.md's row says so, as
    docs/environments.md's `load_environment` section does."""
    spec = " ".join((ROOT / "docs" / "spec.md").read_text().split())
    row = spec.split("| `max_turns`, `max_input_tokens`, `max_output_tokens` |", 1)[1].split(" | ", 2)[1]
    assert "v1 episode limits" not in spec
    for kind in ("v1 `vf.Env`", "`load_environment` (v0) `vf.MultiTurnEnv`, `vf.ToolEnv` or `vf.StatefulToolEnv`"):
        assert kind in row
    page = (ROOT / "docs" / "environments.md").read_text()
    v0 = " ".join(page.split("\n## `load_environment` environments", 1)[1].split("\n## ", 1)[0].split())
    assert "The `[[env]]` episode limits, the same keys as a v1 `Env`'s (docs/spec.md, `[[env]]`)" in v0
    assert all(f"`{key}`" in v0 for key in ("max_turns", "max_input_tokens", "max_output_tokens"))
