"""Usage and cost (docs/usage.md): the price table, one row per LLM call, and the totals
the reports read.

Nothing here is a foreign key: this app sits below ``sessions`` (the runner's event
recording calls it in the event's transaction), and a user's spend outlives the session
it was spent in. Costs are integer nano-dollars (10⁻⁹ USD), computed once when the call
is recorded: a later price change never rewrites history. A cost of ``None`` (or no
priced call in a total) means "unpriced", which is shown as absent, never as 0.

The totals (``SessionUsage``, ``DailyUsage``) are updated by one atomic upsert each per
recorded call (``services.record_call``), so the reports read a few pre-summed rows and
never scan ``LlmCall``.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models

RATE = {"max_digits": 14, "decimal_places": 6, "validators": [MinValueValidator(Decimal(0))]}


class Price(models.Model):
    """USD per million tokens of one model id, or of every id it is the longest listed
    prefix of (``gpt-4o-mini`` prices ``gpt-4o-mini-2024-07-18``)."""

    model = models.CharField(max_length=256, unique=True)
    input_per_million = models.DecimalField(**RATE)  # type: ignore[arg-type]
    output_per_million = models.DecimalField(**RATE)  # type: ignore[arg-type]
    # Blank: 0.1× (read) and 1.25× (write) the input rate, as the reference defaults them.
    cache_read_per_million = models.DecimalField(null=True, blank=True, **RATE)  # type: ignore[arg-type]
    cache_write_per_million = models.DecimalField(null=True, blank=True, **RATE)  # type: ignore[arg-type]
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["model"]

    def __str__(self) -> str:
        return self.model


class Tokens(models.Model):
    """The token counts every usage row carries (``input_tokens`` without the cached part)."""

    input_tokens = models.BigIntegerField(default=0)
    output_tokens = models.BigIntegerField(default=0)
    cache_read_input_tokens = models.BigIntegerField(default=0)
    cache_creation_input_tokens = models.BigIntegerField(default=0)
    reasoning_tokens = models.BigIntegerField(default=0)

    class Meta:
        abstract = True

    @property
    def total_tokens(self) -> int:
        return (
            self.input_tokens
            + self.cache_read_input_tokens
            + self.cache_creation_input_tokens
            + self.output_tokens
        )


class LlmCall(Tokens):
    """One LLM call as the runner reported it (``usage.recorded``), priced when stored."""

    id = models.BigAutoField(primary_key=True)
    session_id = models.CharField(max_length=64)
    response_id = models.CharField(max_length=64)
    # The session's owner when the call was recorded; 0: none.
    user_id = models.BigIntegerField(default=0)
    agent_name = models.CharField(max_length=128, blank=True, default="")
    model = models.CharField(max_length=256, blank=True, default="")
    reported = models.BooleanField(default=True)
    cost_nano = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["session_id", "id"], name="llmcall_session")]

    def __str__(self) -> str:
        return f"{self.session_id} {self.model}"


class Totals(Tokens):
    """A pre-summed total: calls, of which priced, and their cost."""

    llm_calls = models.BigIntegerField(default=0)
    priced_calls = models.BigIntegerField(default=0)
    cost_nano = models.BigIntegerField(default=0)

    class Meta:
        abstract = True


class SessionUsage(Totals):
    """A session's usage per UTC day and model (the snapshot sums the days)."""

    session_id = models.CharField(max_length=64)
    day = models.DateField()
    model = models.CharField(max_length=256, blank=True, default="")
    user_id = models.BigIntegerField(default=0)
    agent_name = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["session_id", "day", "model"], name="unique_session_usage"
            )
        ]
        indexes = [models.Index(fields=["user_id", "day"], name="session_usage_user_day")]

    def __str__(self) -> str:
        return f"{self.session_id} {self.day} {self.model}"


class DailyUsage(Totals):
    """A user's usage per UTC day, model and agent: what ``GET /v1/usage`` reads."""

    user_id = models.BigIntegerField()
    day = models.DateField()
    model = models.CharField(max_length=256, blank=True, default="")
    agent_name = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user_id", "day", "model", "agent_name"], name="unique_daily_usage"
            )
        ]
        indexes = [models.Index(fields=["day"], name="daily_usage_day")]
        verbose_name_plural = "daily usage"

    def __str__(self) -> str:
        return f"user {self.user_id} {self.day} {self.model} {self.agent_name}"


class MonthlyUsage(Totals):
    """The same per calendar month (``month``: its first day): a report over a long range
    reads whole months here and only the days at its edges from ``DailyUsage``."""

    user_id = models.BigIntegerField()
    month = models.DateField()
    model = models.CharField(max_length=256, blank=True, default="")
    agent_name = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user_id", "month", "model", "agent_name"], name="unique_monthly_usage"
            )
        ]
        indexes = [models.Index(fields=["month"], name="monthly_usage_month")]
        verbose_name_plural = "monthly usage"

    def __str__(self) -> str:
        return f"user {self.user_id} {self.month:%Y-%m} {self.model} {self.agent_name}"


class UserBudget(models.Model):
    """A user's own daily budget (usage.md, Budgets), set by staff; no row, or a blank
    limit: the server default ``OMNIGENT_DAILY_BUDGET_USD`` applies."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="budget"
    )
    daily_nano = models.BigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(0)], help_text="nano-dollars a day"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"budget of user {self.user_id}"


class UserBudgetRaise(models.Model):
    """What accepted budget questions added to a user's budget for one UTC day: the
    raise ends with the day, like the day's spend it was measured against."""

    user_id = models.BigIntegerField()
    day = models.DateField()
    raised_nano = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user_id", "day"], name="unique_user_budget_raise")
        ]

    def __str__(self) -> str:
        return f"user {self.user_id} {self.day} +{self.raised_nano}"
