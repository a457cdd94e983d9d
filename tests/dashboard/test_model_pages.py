"""The dashboard's models page (the catalogue and the organization's own, with each pushed model's
latest check and its log) and the new-job form's models menu: the models the organization may
use, another organization's never shown."""

from __future__ import annotations

import io

import pytest
from django.utils import timezone

from jobs.models import Model, ModelBuild
from lab import storage
from tests.support.dashboard import signed_in
from tests.support.model_dirs import model_storage  # noqa: F401  (a fixture: an empty model store)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("model_storage")]


@pytest.fixture
def models(owner, outsider):
    """Acme's ready model (added by the operator), its refused push, and Globex's model."""
    ready = Model.objects.create(
        id="acme/ready-qwen3", family="qwen3", architecture="qwen3", parameters=80_576, context_length=512,
        training_modes=["lora", "full"], memory_gb={"lora": 0.1, "full": 0.1}, revision="0123abcd",
        source="directory", organization=owner.organization,
    )
    refused = Model.objects.create(id="acme/pickled", context_length=0, status="failed", source="push", organization=owner.organization)
    build = ModelBuild.objects.create(
        model=refused, organization=owner.organization, number=2, status="failed", archive_key="models/uploads/x.tar",
        archive_sha256="0" * 64, archive_size_bytes=10, error="the directory holds pickle files", finished_at=timezone.now(),
        log_key="models/logs/acme/pickled/build-2.log",
    )
    storage.put_stream(build.log_key, io.BytesIO(b"refused: the directory holds pickle files\n"), content_type="text/plain")
    Model.objects.create(id="globex/secret", context_length=512, source="push", organization=outsider.organization)
    return ready, refused


def test_the_models_page_lists_the_catalogue_and_the_organizations_own_with_their_checks(owner, member, models):
    page = signed_in(member).get("/o/acme/models/")
    assert page.status_code == 200
    html = page.content.decode()
    own = html[html.index('id="own-models"'):html.index('id="catalogue"')]
    assert "<code>acme/ready-qwen3</code>" in own and "added by the operator" in own and "full 0.1, lora 0.1" in own
    assert "<code>acme/pickled</code>" in own and "check 2 failed" in own and "the directory holds pickle files" in own
    assert 'href="/o/acme/models/acme/pickled/build-log/"' in own
    catalogue = html[html.index('id="catalogue"'):]
    assert "<code>lab/tiny-random-qwen3-moe</code>" in catalogue and "<code>HuggingFaceTB/SmolLM2-135M-Instruct</code>" in catalogue
    assert "globex/secret" not in html
    log = signed_in(owner.user).get("/o/acme/models/acme/pickled/build-log/")
    assert (log.status_code, log.content) == (200, b"refused: the directory holds pickle files\n")


def test_another_organizations_model_and_its_log_are_missing_from_the_pages(outsider, models):
    client = signed_in(outsider.user)
    assert client.get("/o/acme/models/").status_code == 404  # not a member of acme
    theirs = client.get("/o/globex/models/").content.decode()
    assert "acme/" not in theirs and "<code>globex/secret</code>" in theirs
    foreign = client.get("/o/globex/models/acme/pickled/build-log/")
    missing = client.get("/o/globex/models/acme/nothing/build-log/")
    assert foreign.status_code == missing.status_code == 404


def test_the_new_job_form_offers_the_usable_models_and_fills_one_in(owner, models):
    client = signed_in(owner.user)
    page = client.get("/o/acme/p/default/jobs/new/").content.decode()
    menu = page[page.index('id="models-menu"'):page.index("</details>", page.index('id="models-menu"'))]
    assert "acme/ready-qwen3" in menu and "Acme's own" in menu and "lab/tiny-random-llama" in menu
    assert "acme/pickled" not in menu and "globex/secret" not in menu  # not ready; not Acme's
    chosen = client.get("/o/acme/p/default/jobs/new/?example=addition-tiny&model=acme/ready-qwen3").content.decode()
    assert "model = &quot;acme/ready-qwen3&quot;" in chosen
    foreign = client.get("/o/acme/p/default/jobs/new/?example=addition-tiny&model=globex/secret").content.decode()
    assert "globex/secret" not in foreign and "model = &quot;lab/tiny-random-llama&quot;" in foreign
