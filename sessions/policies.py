"""A session's policy rules: its own (``PUT .../policies``), its bundle's, the effective list.

Rules are validated by ``omnigent_runner.policies``, the module the runner evaluates
them with, so what the server accepts is what the runner understands. The session's
own rules are stored validated on the session; every replacement is audited
(``PolicyChange``). Sending the new list to a runner is the caller's part
(``runners.policy_views``).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from django.db import transaction

from audit import actions as audit_actions
from audit import services as audit
from omnigent_runner.bundles import BundleError, parse_bundle
from omnigent_runner.policies import (
    NO_GUARDRAILS,
    Guardrails,
    RuleError,
    effective_rules,
    parse_rules,
    rules_as_json,
)
from omnigent_runner.protocol import PolicyRule
from omnigent_site.domain_errors import InvalidInput

from . import blobs
from .approvals import ask_timeout_cap
from .models import Agent, PolicyChange, Session

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=256)
def _bundle_guardrails(sha256: str) -> Guardrails:
    """A bundle's checked ``guardrails``; bundles are stored by content hash, so the
    answer for a hash never changes and is worth keeping."""
    try:
        return parse_bundle(blobs.read_bundle(sha256)).spec.guardrails
    except BundleError as exc:
        # Stored before guardrails were checked: the runner refuses to load it anyway.
        log.warning("bundle %s: guardrails unreadable: %s", sha256[:12], exc)
        return NO_GUARDRAILS


def bundle_guardrails(*, agent: Agent) -> Guardrails:
    """The guardrails of the agent's bundle, read from the bundle bytes themselves
    (the stored spec masks secret-looking keys, which a rule's ``when`` may use).
    Raises ``blobs.BundleMissing`` when this server cannot see the bundle file."""
    return _bundle_guardrails(agent.bundle_sha256)


def session_rules(*, session: Session) -> list[PolicyRule]:
    """The session's own rules (stored validated; a row that no longer validates is
    logged and counts as no rules rather than failing every turn)."""
    if not session.policy_rules:
        return []
    try:
        return parse_rules(session.policy_rules)
    except RuleError as exc:
        log.error("session %s: stored policy rules do not validate: %s", session.id, exc)
        return []


def effective(*, session: Session) -> tuple[list[PolicyRule], int]:
    """The rules the runner evaluates, in order, and how many of them are the session's.

    Session rules first, then the bundle's; each ``ask`` rule carries its timeout
    (the rule's, the bundle's or 3,600 s), capped by ``OMNIGENT_ASK_TIMEOUT_S``.
    """
    own = session_rules(session=session)
    rules = effective_rules(
        session_rules=own,
        bundle=bundle_guardrails(agent=session.agent),
        max_ask_timeout=ask_timeout_cap(),
    )
    return rules, len(own)


def replace_session_rules(*, session: Session, user: AuthUser, raw: object) -> Session:
    """Validate and store the session's own rules, and record who changed them.

    Bad rules are a 400 naming each problem (``rules.<index>.<field>``) and change
    nothing.
    """
    try:
        rules = parse_rules(raw, prefix="rules")
    except RuleError as exc:
        raise InvalidInput(str(exc), fields=exc.fields) from exc
    new_rules = rules_as_json(rules)
    with transaction.atomic():
        locked = Session.objects.select_for_update().get(pk=session.pk)
        old_rules = locked.policy_rules or []
        locked.policy_rules = new_rules
        locked.save(update_fields=["policy_rules", "updated_at"])
        change = PolicyChange.objects.create(
            session=locked, user=user, old_rules=old_rules, new_rules=new_rules
        )
        audit.record(
            actor=user,
            action=audit_actions.POLICY_CHANGE,
            target_type="session",
            target_id=locked.id,
            session_id=locked.id,
            details={"policy_change_id": change.pk, "old_rules": old_rules, "new_rules": new_rules},
        )
    session.policy_rules = new_rules
    return session
