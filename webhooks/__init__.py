"""Outbound webhooks (automation.md, Webhooks): endpoints' services, fan-out and delivery.

The events themselves are written by the facts' own writers into the outbox
(``webhook_outbox``, below ``sessions``); this app, above ``runners``, decides who
receives each one (``fanout``) and sends them (``delivery``).
"""
