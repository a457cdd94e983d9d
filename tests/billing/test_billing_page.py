"""The dashboard's billing page: every member reads it; only owners and admins buy credits, open the
portal or change limits (members 403 on every form, outsiders 404)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from billing.accounts import account_for
from lab.models import Organization
from tests.support.billing import record
from tests.support.dashboard import signed_in
from tests.support.fake_stripe import FakeStripe

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("default_prices")]


def url(tenant, suffix="") -> str:
    return f"/o/{tenant.organization.slug}/billing/{suffix}"


def test_the_owner_sees_balance_usage_chart_jobs_and_forms(owner, settings):
    settings.LAB_POOL = {"nodes": [{"gpu_type": "H100", "gpus": 8, "count": 1}]}
    record(owner, job_id="job_cheap", seconds=600, attempt_id=1)
    record(owner, job_id="job_dear", seconds=600, resource="H100", gpus=2, attempt_id=2)
    response = signed_in(owner.user).get(url(owner))
    assert response.status_code == 200
    page = response.content.decode()
    assert 'id="buy-credits"' in page and 'id="billing-settings"' in page and 'id="portal"' in page
    assert "Billing is off on this Lab" in page
    assert page.index("job_dear") < page.index("job_cheap")  # jobs by cost, dearest first
    assert "0.833333" in page and "0.016667" in page
    assert '<script id="billing-data" type="application/json">' in page
    chart = json.loads(page.split('<script id="billing-data" type="application/json">')[1].split("</script>")[0])
    assert [line["resource"] for line in chart["series"]] == ["H100", "cpu"]
    assert len(chart["x"]) == len(chart["series"][0]["cost_usd"]) == 31
    assert sum(chart["series"][0]["cost_usd"]) == pytest.approx(0.833333)


def test_a_member_sees_usage_but_every_form_is_403(owner, member):
    client = signed_in(member)
    page = client.get(url(owner)).content.decode()
    assert 'id="billing-summary"' in page and 'id="buy-credits"' not in page and 'id="billing-settings"' not in page
    for suffix, data in (("checkout/", {"amount_usd": "25.00"}), ("portal/", {}), ("settings/", {"max_running_jobs": "1"})):
        assert client.post(url(owner, suffix), data).status_code == 403
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs is None


def test_an_outsider_gets_404_on_the_page_and_the_forms(owner, outsider):
    client = signed_in(outsider.user)
    assert client.get(url(owner)).status_code == 404
    assert client.post(url(owner, "settings/"), {"max_running_jobs": "1"}).status_code == 404
    assert client.post(url(owner, "checkout/"), {"amount_usd": "25.00"}).status_code == 404
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs is None


def test_the_owner_sets_limits_and_bad_values_are_400_changing_nothing(owner):
    client = signed_in(owner.user)
    saved = client.post(url(owner, "settings/"), {"monthly_spend_limit_usd": "40.00", "max_running_jobs": "2"})
    assert saved.status_code == 302
    assert account_for(owner.organization.pk).monthly_spend_limit_micro_usd == 40_000_000
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs == 2

    for data in ({"monthly_spend_limit_usd": "-3", "max_running_jobs": "2"}, {"monthly_spend_limit_usd": "40.00", "max_running_jobs": "x" * 5000}):
        refused = client.post(url(owner, "settings/"), data)
        assert refused.status_code == 400
        assert b'class="error"' in refused.content
    assert account_for(owner.organization.pk).monthly_spend_limit_micro_usd == 40_000_000

    cleared = client.post(url(owner, "settings/"), {"monthly_spend_limit_usd": "", "max_running_jobs": ""})
    assert cleared.status_code == 302
    assert account_for(owner.organization.pk).monthly_spend_limit_micro_usd is None
    assert Organization.objects.get(pk=owner.organization.pk).max_running_jobs is None


def test_buying_credits_redirects_to_stripe_checkout(owner, billing_on):
    with FakeStripe() as fake:
        billing_on.STRIPE_API_BASE = fake.base_url
        client = signed_in(owner.user)
        response = client.post(url(owner, "checkout/"), {"amount_usd": "50.00"})
        assert response.status_code == 302
        assert response["Location"].startswith("https://checkout.stripe.test/c/")
        assert fake.calls("/v1/checkout/sessions")[0]["form"]["metadata[credit_cents]"] == "5000"
        assert client.post(url(owner, "checkout/"), {"amount_usd": "nope"}).status_code == 400
        assert len(fake.calls("/v1/checkout/sessions")) == 1
        portal = client.post(url(owner, "portal/"))
        assert portal.status_code == 302 and portal["Location"].startswith("https://billing.stripe.test/p/")


def test_buying_credits_with_billing_off_says_so(owner):
    response = signed_in(owner.user).post(url(owner, "checkout/"), {"amount_usd": "50.00"})
    assert response.status_code == 409
    assert b"Billing is off" in response.content


def test_usage_older_than_the_chart_is_left_out(owner):
    record(owner, job_id="job_old", seconds=60, ended=timezone.now() - timedelta(days=45))
    assert "job_old" not in signed_in(owner.user).get(url(owner)).content.decode()
