"""The SDK's ``lab.models`` and the CLI's ``lab models`` and ``lab spec init`` against the real API
on a live HTTP server: a directory pushed (packed and streamed), its check run as the worker would
run it, then listed, shown, its log printed; another organization sees nothing of it."""

from __future__ import annotations

import json

import pytest
from labsdk import BadRequestError, Lab, ModelCheckFailedError, NotFoundError
from labsdk.cli import main

from jobs.models import ModelBuild
from jobs.registry.builds import build_run
from tests.support.model_dirs import (
    model_storage,  # noqa: F401  (a fixture: an empty model store)
    tiny_model_directory,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("model_storage")]

MODEL_ID = "acme/tiny-qwen3"


@pytest.fixture(autouse=True)
def _no_worker(monkeypatch):
    """The checks are run by the test as a worker would run them (tests/e2e has the real worker)."""
    monkeypatch.setattr("jobs.registry.services.enqueue_on_commit", lambda *args: None)


def check_latest() -> ModelBuild:
    return build_run(ModelBuild.objects.unscoped().order_by("-pk").first().pk)


def test_the_sdk_pushes_a_directory_and_follows_its_check(live_server, owner, outsider, tmp_path):
    directory = tiny_model_directory(tmp_path / "model")
    (directory / ".cache").mkdir()
    (directory / ".cache" / "huggingface.lock").write_text("left out")
    link = tmp_path / "linked"
    link.mkdir()
    for path in directory.iterdir():
        if path.is_file():
            (link / path.name).symlink_to(path)  # a Hugging Face cache's snapshot is links into its blobs
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)

    pushed = lab.models.push(link, name=MODEL_ID)
    assert (pushed.id, pushed.status, pushed.build.number, pushed.build.status) == (MODEL_ID, "checking", 1, "queued")
    check_latest()
    model = lab.models.wait(MODEL_ID, timeout=5, poll_interval=0.1)
    assert (model.status, model.architecture, model.parameters, model.owned_by) == ("ready", "qwen3", 80_576, "acme")
    assert model.build.revision == model.revision
    assert "check 1: passed" in lab.models.build_log(MODEL_ID)
    assert MODEL_ID in {found.id for found in lab.models.list()}

    with pytest.raises(BadRequestError, match="this organization's models are named acme/<name>"):
        lab.models.push(directory, name="globex/stolen")
    with pytest.raises(ValueError, match="no config.json"):
        lab.models.push(tmp_path, name=MODEL_ID)
    theirs = Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0)
    with pytest.raises(NotFoundError):
        theirs.models.retrieve(MODEL_ID)
    with pytest.raises(NotFoundError):
        theirs.models.build_log(MODEL_ID)
    assert MODEL_ID not in {found.id for found in theirs.models.list()}

    (directory / "extra.pkl").write_bytes(b"\x80\x04")
    lab.models.push(directory, name="acme/pickled")
    check_latest()
    with pytest.raises(ModelCheckFailedError, match="pickle files, which run code when loaded: extra.pkl") as failed:
        lab.models.wait("acme/pickled", timeout=5, poll_interval=0.1)
    assert failed.value.model.status == "failed"


def test_the_cli_pushes_lists_shows_and_prints_the_log(live_server, owner, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    directory = tiny_model_directory(tmp_path / "model")
    assert main(["models", "push", str(directory), "--name", MODEL_ID]) == 0
    assert capsys.readouterr().out == (
        f"{MODEL_ID}: check 1 queued (follow it with `lab models get {MODEL_ID}`, `lab models build-log {MODEL_ID}`)\n"
    )
    check_latest()
    assert main(["models", "get", MODEL_ID]) == 0
    shown = capsys.readouterr().out
    assert "status:        ready\n" in shown and "architecture:  qwen3\n" in shown and "check:         1 ready\n" in shown
    assert main(["models", "build-log", MODEL_ID]) == 0
    assert capsys.readouterr().out.endswith("check 1: passed\n")
    assert main(["models", "--json"]) == 0
    listed = {item["id"]: item for item in json.loads(capsys.readouterr().out)}
    assert listed[MODEL_ID]["status"] == "ready" and listed["lab/tiny-random-llama"]["owned_by"] is None

    # lab spec init names the models this organization may use and refuses one it may not.
    assert main(["spec", "init", "--model", MODEL_ID]) == 0
    template = capsys.readouterr().out
    assert f'model = "{MODEL_ID}"' in template
    assert f"#   {MODEL_ID}  (qwen3, 80,576 parameters, context 512, lora and full)\n" in template
    with pytest.raises(SystemExit) as refused:
        main(["spec", "init", "--model", "globex/theirs"])
    assert refused.value.code == 2
    assert "model 'globex/theirs' is not one this organization may use" in capsys.readouterr().err
