"""The admin's usage pages (docs/usage.md): prices editable, usage by user named."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from omnigent_site.users import get_or_create_user
from usage import services as usage_services
from usage.models import DailyUsage, Price

from .conftest import ALICE, BOB

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(django_user_model) -> APIClient:
    admin = django_user_model.objects.create_superuser(username="root", password="pw")
    client = APIClient()
    client.force_login(admin)
    return client


def test_usage_by_user_names_each_user_and_searches_by_name(admin_client) -> None:
    for user, cost in ((ALICE, 1_000), (BOB, 2_000)):
        DailyUsage.objects.create(
            user_id=get_or_create_user(user).pk, day=date(2026, 3, 1), model="gpt-4o",
            llm_calls=1, priced_calls=1, cost_nano=cost,
        )  # fmt: skip
    page = admin_client.get("/admin/usage/dailyusage/")
    assert page.status_code == 200
    assert ALICE in page.content.decode() and BOB in page.content.decode()
    searched = admin_client.get(f"/admin/usage/dailyusage/?q={BOB}").content.decode()
    assert BOB in searched and ALICE not in searched


def test_a_price_edited_in_the_admin_prices_the_next_call(
    admin_client, django_capture_on_commit_callbacks
) -> None:
    usage_services.prices.clear()
    price = Price.objects.create(
        model="edited-model", input_per_million=Decimal("1"), output_per_million=Decimal("1")
    )
    usage = usage_services.CallUsage(model="edited-model-v2", input_tokens=1000)
    assert usage_services.cost_of(usage) == 1_000_000
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(
            f"/admin/usage/price/{price.pk}/change/",
            {"model": "edited-model", "input_per_million": "3", "output_per_million": "1"},
        )
    assert response.status_code == 302, response.content[:500]
    assert usage_services.cost_of(usage) == 3_000_000
