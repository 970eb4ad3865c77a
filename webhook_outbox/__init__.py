"""The webhook outbox: one row per fact that webhooks report (automation.md, Webhooks).

This app sits just above ``omnigent_site`` and below ``sessions`` (docs/architecture.md,
Layers), so every writer of a fact (``sessions``, ``runners``, later ``schedules`` and
usage) can write the event row in the same transaction as the fact it reports, with
``webhook_outbox.events.enqueue_webhook_event``. Who receives an event, and its delivery,
are the ``webhooks`` app's part, higher up.
"""
