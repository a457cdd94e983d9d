"""Every ``lab evals`` and ``lab checkpoints eval`` command that docs/evaluations.md and the README
show runs as written against a live Lab: its code blocks' lines, its inline commands and the
README's ``(or --checkpoint ..., --adapter ..., --deployment ..., --endpoint ...)`` forms of
``lab evals run``, with only the placeholders filled in (ids of this project's checkpoint,
adapter, deployment and evaluations; ``N``, ``K``, ``URL``, ``MODEL``, ``NAME``).

The CLI runs as a subprocess against Django's live server; a command that waits (``--wait``)
waits for real while the test ends its evaluation as an engine would (every sample through the
ingest service, then the job's end), since no worker runs here. ``lab evals push`` needs a
folder of a real ``vf-eval`` run: tests/evaluations/test_vf_eval_push.py pushes such folders.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from evaluations.models import Evaluation
from jobs.models import JobStatus
from lab.audit import Actor
from serving.services import deployment_create
from tests.support.artifacts import artifact_storage  # noqa: F401
from tests.support.cli import lab_cli_started
from tests.support.evaluations import end_evaluation
from tests.support.jobs_helpers import Engine, ready_checkpoint, submit
from tests.support.serving import ready_adapter
from tests.support.stack import wait_for

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "docs" / "evaluations.md", ROOT / "README.md")
TINY = "lab/tiny-random-llama"
#: What the README's placeholders stand for (``NAME`` is a secret's name, its value taken from the
#: variable of that name, which the test sets).
PLACEHOLDERS = {"N": "2", "K": "2", "URL": "https://api.example.com/v1", "MODEL": "acme/chat", "NAME": "EVAL_KEY"}
#: What each way of naming the target evaluates (``lab checkpoints eval`` is ``--checkpoint``).
TARGET_FLAGS = {"--model": "model", "--checkpoint": "checkpoint", "--adapter": "adapter", "--deployment": "deployment",
                "--endpoint": "endpoint"}


def _readme_run_forms(text: str) -> list[str]:
    """``lab evals run --model ID ...`` of the README, and the same with each ``(or ...)`` form in
    place of ``--model ID``."""
    found = re.search(r"`(lab evals run --model ID [^`]*)` \(or ((?:`[^`]*`[, ]*)+)\)", text)
    assert found, "the README shows lab evals run --model ID ... (or ...)"
    command = found.group(1)
    return [command, *(command.replace("--model ID", form) for form in re.findall(r"`([^`]*)`", found.group(2)))]


#: Commands that cannot run without arguments: named alone, they are references.
NAMED_ONLY = {"lab evals run", "lab checkpoints eval", "lab evals push", "lab evals samples"}


def documented_commands(page: Path) -> list[str]:
    """The ``lab evals``/``lab checkpoints eval`` command lines of ``page``: those of its bash
    blocks (continuation lines joined, comments dropped) and its inline ones, in order."""
    text = page.read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            commands.append(" ".join(line.split(" #", 1)[0].split()))
    prose = " ".join(re.sub(r"```.*?```", "", text, flags=re.S).split())
    # A command that needs arguments, named without them in prose ("in `lab evals run`, --env ID
    # is ..."), is a reference to it, not a line to run.
    commands += [command for command in re.findall(r"(?<!`)`(lab [^`]*)`", prose) if command not in NAMED_ONLY]
    if page.name == "README.md":
        commands = [command for command in commands if not command.startswith("lab evals run --model ID")]
        commands += _readme_run_forms(prose)
    return [command for command in commands if re.match(r"lab (evals|checkpoints eval)\b", command)]


def test_it_finds_the_commands_of_the_pages():
    page = documented_commands(PAGES[0])
    readme = documented_commands(PAGES[1])
    assert page[:3] == [
        "lab evals run --model lab/tiny-random-llama --env lab/addition --env-args 'lab/addition={\"max_operand\": 9}' "
        "--num-examples 32 --rollouts 4 --temperature 0.7 --max-tokens 24 --wait",
        "lab evals get EVAL_ID",
        "lab evals samples EVAL_ID --env lab/addition --max-reward 0",
    ]
    assert "lab checkpoints eval CKPT_ID --env ID ..." in page
    assert {flag for command in readme for flag in TARGET_FLAGS if f" {flag} " in command} == set(TARGET_FLAGS)
    assert "lab evals cancel ID" in readme


def _filled(command: str, ids: dict[str, str]) -> list[str]:
    """``command``'s arguments with its placeholders filled from ``PLACEHOLDERS`` and ``ids``
    (``checkpoint``, ``adapter``, ``deployment``, ``key``, and ``evaluation`` for ``EVAL_ID`` or an
    id argument); a trailing ``...`` (more flags may follow) is left out."""
    words = shlex.split(command)[1:]
    filled = []
    for index, word in enumerate(words):
        before = words[index - 1] if index else ""
        if word == "...":
            continue
        if word == "ID":
            word = {"--model": TINY, "--env": "lab/addition"}.get(before, ids.get("evaluation", ""))
        elif word in PLACEHOLDERS:
            word = PLACEHOLDERS[word]
        elif word == "EVAL_ID":
            word = ids.get("evaluation", "")
        word = word.replace("CKPT_ID", ids["checkpoint"]).replace("ckpt_...", ids["checkpoint"])
        word = word.replace("adp_...", ids["adapter"]).replace("dep_...", ids["deployment"]).replace("lab_...", ids["key"])
        filled.append(word)
    return filled


def _target(words: list[str]) -> str:
    """What a ``lab evals run``/``lab checkpoints eval`` line evaluates: a ``TARGET_FLAGS`` value."""
    if words[:2] == ["checkpoints", "eval"]:
        return "checkpoint"
    (kind,) = [TARGET_FLAGS[word] for word in words if word in TARGET_FLAGS]
    return kind


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("artifact_storage")
def test_every_documented_evaluation_command_runs_as_written(live_server, owner, spec):
    checkpoint_id, _ = ready_checkpoint(Engine(submit(owner, spec, lora_rank=4, lora_alpha=8)))
    deployment = deployment_create(project=owner.project, actor=Actor(user=owner.user), data={"source": {"type": "model", "id": TINY}})
    ids = {"checkpoint": checkpoint_id, "adapter": ready_adapter(owner), "deployment": deployment.public_id, "key": owner.key}
    # `--secret NAME` takes the value of $NAME.
    variables = {"ACME_KEY": "sk-acme", "EVAL_KEY": owner.key}

    def run(words: list[str]) -> tuple[int, str, str]:
        before = set(Evaluation.objects.unscoped().values_list("public_id", flat=True))
        process = lab_cli_started(*words, key=owner.key, base_url=live_server.url, env=variables)
        if "--wait" in words:
            created = wait_for(lambda: Evaluation.objects.unscoped().exclude(public_id__in=before).first(), timeout=30,
                               what=f"the evaluation of `lab {' '.join(words)}`")
            end_evaluation(created.public_id, JobStatus.SUCCEEDED)
        stdout, stderr = process.communicate(timeout=60)
        return process.returncode, stdout, stderr

    for page in PAGES:
        commands = [(command, _filled(command, ids)) for command in documented_commands(page)]
        ran = set()
        # First what creates evaluations, then what reads them, then the list, then a cancel.
        for command, words in commands:
            if words[1] != "run" and words[:2] != ["checkpoints", "eval"]:
                continue
            before = set(Evaluation.objects.unscoped().values_list("public_id", flat=True))
            code, stdout, stderr = run(words)
            assert code == 0, f"`{command}` as `lab {shlex.join(words)}`: {stderr}"
            evaluation = Evaluation.objects.unscoped().select_related("job").exclude(public_id__in=before).get()
            kind = _target(words)
            assert evaluation.target_type == kind, command
            assert stdout.splitlines()[0] == evaluation.public_id
            if "--wait" in words:
                assert evaluation.job.status == JobStatus.SUCCEEDED
                planned = evaluation.environments[0]["num_examples"] * evaluation.environments[0]["rollouts_per_example"]
                assert any(line.split()[:3] == ["lab/addition", str(planned), "0.500"] for line in stdout.splitlines()), stdout
                ids["evaluation"] = evaluation.public_id
            else:
                ids["queued"] = evaluation.public_id
            ran.add(command)
        for command, _ in commands:
            words = _filled(command, ids)
            if words[1] not in ("get", "samples"):
                continue
            code, stdout, stderr = run(words)
            assert code == 0, f"`{command}`: {stderr}"
            if words[1] == "get":
                assert stdout.splitlines()[0].startswith(f"{ids['evaluation']} succeeded "), stdout
            else:  # --max-reward 0: the odd examples, which end_evaluation scores 0
                rewards = [line.split()[3] for line in stdout.splitlines() if line.startswith("lab/addition")]
                assert rewards and set(rewards) == {"0.000"}, stdout
            ran.add(command)
        for command, _ in commands:
            words = _filled(command, {**ids, "evaluation": ids.get("queued", "")})
            if words[1] not in ("list", "cancel"):
                continue
            code, stdout, stderr = run(words)
            assert code == 0, f"`{command}`: {stderr}"
            if words[1] == "cancel":
                assert stdout == f"{ids['queued']} cancelled\n"
            else:
                assert ids["evaluation"] in stdout, stdout
            ran.add(command)
        untested = [command for command, _ in commands if command not in ran and not command.startswith("lab evals push")]
        assert untested == [], f"{page.name}: documented commands this test does not run"
