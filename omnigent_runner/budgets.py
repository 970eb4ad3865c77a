"""The budgets a session's turns check before every LLM call (usage.md, "Budgets").

The server owns the numbers: it sends a session's budget lines in ``session.open`` and
``turn.start`` and again in a ``policy.update`` after each LLM call it records and after
a budget changes. The runner keeps the latest lines per open session and checks them
before each model call, so a turn stops (or asks) without a round trip to the server.

The runner cannot price a call (the price table lives on the server), so ``spent`` only
moves when the server's next update arrives. A call that starts before the update for
the previous call has arrived is let through; the overshoot is therefore bounded by one
LLM call per running turn, the bound usage.md states.

Two local additions keep the check useful between updates:

- an accepted budget question raises the line's limit here at once (the server raises
  its own and its next update replaces these numbers);
- a session with no session line from the server (an older server) is checked against
  the bundle's ``guardrails.budget_usd`` with nothing spent, so only a zero budget stops
  it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal, TypedDict

from omnigent_runner.policies import NANO_PER_USD, Guardrails, nano_as_usd
from omnigent_runner.protocol import BudgetLine, Budgets

Scope = Literal["session", "user"]
OnBudget = Literal["ask", "deny"]


class BudgetAmounts(TypedDict):
    scope: Scope
    budget_usd: float
    spent_usd: float


@dataclass(frozen=True, slots=True)
class Overrun:
    """A budget that is spent as a model call is about to start, and what to do."""

    scope: Scope
    limit_nano: int
    spent_nano: int
    on_budget: OnBudget
    # What an accepted question adds: the bundle's ``ask_increment_usd``, else the
    # budget again; 0 (a zero budget with no increment) cannot be raised, so it denies.
    increment_nano: int

    @property
    def denies(self) -> bool:
        return self.on_budget == "deny" or self.increment_nano <= 0

    def describe(self) -> str:
        """A sentence for the turn's error and the logs (amounts only, no secrets)."""
        return (
            f"the {self.scope} budget is spent: {usd_text(self.spent_nano)} of "
            f"{usd_text(self.limit_nano)}"
        )

    def amounts(self) -> BudgetAmounts:
        """The budget and what is spent of it, as a ``budget_exceeded`` error carries
        them beside its message (protocol.md, Budgets)."""
        return {
            "scope": self.scope,
            "budget_usd": nano_as_usd(self.limit_nano),
            "spent_usd": nano_as_usd(self.spent_nano),
        }

    def params(self) -> dict[str, object]:
        """The question's ``params`` (approval ``arguments``) as usage.md names them."""
        return {
            "kind": "budget",
            **self.amounts(),
            "increment_usd": nano_as_usd(self.increment_nano),
        }


@dataclass
class SessionBudgets:
    """The latest budget lines of one open session, with the runner's local raises."""

    # The server's latest lines (None: it sent none yet, an older server).
    server: Budgets | None = None
    # Raises from accepted questions since the server's last update, per scope.
    raised: dict[str, int] = field(default_factory=dict)
    # Raises of the bundle-only session line, which the server never sends back.
    bundle_raised: int = 0

    def update(self, budgets: Budgets | None) -> None:
        """The server's new numbers replace the old ones and the local raises (its own
        raise of an accepted question is in them). ``None`` changes nothing."""
        if budgets is None:
            return
        self.server = budgets
        self.raised.clear()

    def lines(self, guardrails: Guardrails) -> list[BudgetLine]:
        """The lines to check: the session's, then the user's."""
        server = self.server or Budgets()
        lines: list[BudgetLine] = []
        if server.session is not None:
            lines.append(self._raise(server.session))
        elif guardrails.budget_nano is not None:
            lines.append(
                BudgetLine(
                    scope="session",
                    limit_nano=guardrails.budget_nano + self.bundle_raised,
                    spent_nano=0,
                )
            )
        if server.user is not None:
            lines.append(self._raise(server.user))
        return lines

    def overrun(self, guardrails: Guardrails) -> Overrun | None:
        """The first line whose budget is spent, or None: the call may start."""
        for line in self.lines(guardrails):
            if line.spent_nano < line.limit_nano:
                continue
            increment = guardrails.ask_increment_nano
            return Overrun(
                scope=line.scope,
                limit_nano=line.limit_nano,
                spent_nano=line.spent_nano,
                on_budget=line.on_budget or guardrails.on_budget,
                increment_nano=line.limit_nano if increment is None else increment,
            )
        return None

    def accept(self, overrun: Overrun) -> None:
        """An accepted question: that line's limit goes up by the increment at once."""
        if overrun.scope == "session" and (self.server is None or self.server.session is None):
            self.bundle_raised += overrun.increment_nano
            return
        self.raised[overrun.scope] = self.raised.get(overrun.scope, 0) + overrun.increment_nano

    def _raise(self, line: BudgetLine) -> BudgetLine:
        extra = self.raised.get(line.scope, 0)
        if not extra:
            return line
        return BudgetLine(
            scope=line.scope,
            limit_nano=line.limit_nano + extra,
            spent_nano=line.spent_nano,
            on_budget=line.on_budget,
        )


def usd_text(nano: int) -> str:
    """Nano-dollars as ``$0.0012`` (at least two decimals, no trailing zeros past them)."""
    text = f"{Decimal(nano) / NANO_PER_USD:.9f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"${whole}.{fraction.ljust(2, '0')}"
