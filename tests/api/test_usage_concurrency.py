"""Concurrent recording (docs/usage.md): every call adds to the shared totals in the
database (``INSERT … ON CONFLICT … DO UPDATE SET n = n + excluded.n``), so writers on
separate connections never lose an increment. Run on PostgreSQL (make test-postgres):
SQLite serialises its writers anyway."""

from __future__ import annotations

import threading
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction

from usage import services as usage_services
from usage.models import DailyUsage, LlmCall, MonthlyUsage, Price, SessionUsage

WRITERS = 8
CALLS = 40


@pytest.mark.postgres
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_concurrent_calls_lose_no_increment() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("runs on PostgreSQL (make test-postgres)")
    Price.objects.update_or_create(
        model="gpt-4o",
        defaults={"input_per_million": Decimal("2.5"), "output_per_million": Decimal("10")},
    )
    usage_services.prices.clear()
    start = threading.Barrier(WRITERS)
    failures: list[BaseException] = []

    def write(n: int) -> None:
        try:
            start.wait()
            for _ in range(CALLS):
                with transaction.atomic():
                    usage_services.record_call(
                        session_id="conv_shared",
                        response_id=f"resp_{n}",
                        user_id=7,
                        agent_name="helper",
                        usage=usage_services.CallUsage(
                            model="gpt-4o", input_tokens=1000, output_tokens=100
                        ),
                    )
        except BaseException as exc:  # reported below, with the thread's own error
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=100)
    assert not failures, failures
    calls = WRITERS * CALLS
    assert LlmCall.objects.count() == calls
    (daily,) = DailyUsage.objects.filter(user_id=7)
    (session,) = SessionUsage.objects.filter(session_id="conv_shared")
    (monthly,) = MonthlyUsage.objects.filter(user_id=7)
    for total in (daily, session, monthly):
        assert total.llm_calls == total.priced_calls == calls
        assert total.input_tokens == 1000 * calls
        assert total.output_tokens == 100 * calls
        # 1000 × 2.5 + 100 × 10 = 3500 µUSD = 3,500,000 nano-dollars a call.
        assert total.cost_nano == 3_500_000 * calls
