"""The SDK's ``lab.environments`` and the CLI's ``lab envs`` against the real API on a live HTTP server."""

from __future__ import annotations

import json

import pytest
from labsdk import BadRequestError, ConflictError, Lab, NotFoundError
from labsdk.cli import main

from environments.models import EnvironmentPackage
from tests.support.wheelbuilder import build_wheel

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _own_storage(settings, tmp_path):
    settings.STORAGES = {
        **settings.STORAGES,
        "checkpoints": {"BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path / "store")}},
    }


def wheel_file(tmp_path, **kwargs):
    filename, data = build_wheel(**kwargs)
    path = tmp_path / filename
    path.write_bytes(data)
    return path


def test_the_sdk_pushes_lists_gets_and_deletes(live_server, owner, outsider, tmp_path):
    lab = Lab(api_key=owner.key, base_url=live_server.url, max_retries=0)
    pushed = lab.environments.push(wheel_file(tmp_path, version="0.1.0"))
    assert (pushed.id, pushed.kind, pushed.version, pushed.verifiers_version) == ("acme/my-env@0.1.0", "verifiers", "0.1.0", ">=0.4.0")
    lab.environments.push(wheel_file(tmp_path, version="0.2.0"))
    assert [item.id for item in lab.environments.list()][-2:] == ["acme/my-env@0.2.0", "acme/my-env@0.1.0"]
    assert lab.environments.retrieve("acme/my-env").id == "acme/my-env@0.2.0"
    assert lab.environments.get("acme/my-env@0.1.0").sha256 == pushed.sha256
    with pytest.raises(ConflictError):
        lab.environments.push(wheel_file(tmp_path, version="0.1.0", files={"my_env/__init__.py": "__all__ = []\n"}))
    with pytest.raises(BadRequestError, match="not a zip archive"):
        bogus = tmp_path / "my_env-0.3.0-py3-none-any.whl"
        bogus.write_bytes(b"nope")
        lab.environments.push(bogus)
    with pytest.raises(NotFoundError):
        Lab(api_key=outsider.key, base_url=live_server.url, max_retries=0).environments.retrieve("acme/my-env")
    lab.environments.delete("acme/my-env@0.2.0")
    assert lab.environments.retrieve("acme/my-env").id == "acme/my-env@0.1.0"
    assert EnvironmentPackage.objects.unscoped().filter(deleted_at__isnull=False).count() == 1


def test_the_cli_pushes_lists_shows_and_deletes(live_server, owner, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LAB_API_KEY", owner.key)
    monkeypatch.setenv("LAB_BASE_URL", live_server.url)
    wheel = wheel_file(tmp_path, version="0.1.0")

    assert main(["envs", "push", str(wheel)]) == 0
    assert capsys.readouterr().out == "acme/my-env@0.1.0\n"
    assert main(["envs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [item["id"] for item in listed] == ["lab/addition", "lab/reverse-text", "lab/alphabet-sort", "acme/my-env@0.1.0"]
    assert main(["envs", "list"]) == 0
    assert "acme/my-env@0.1.0" in capsys.readouterr().out
    assert main(["envs", "info", "acme/my-env"]) == 0
    info = capsys.readouterr().out.splitlines()
    assert info[0] == "id:           acme/my-env@0.1.0" and "kind:         verifiers" in info
    assert main(["envs", "delete", "acme/my-env"]) == 0
    assert capsys.readouterr().out == "deleted acme/my-env@0.1.0\n"
    assert main(["envs", "info", "acme/my-env"]) == 1
    assert "No such environment. (not_found)" in capsys.readouterr().err
