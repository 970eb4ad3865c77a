"""Who is calling (http-api.md, Auth).

Order: the identity header set by an authenticating proxy, a DRF token, a Django
login session, and finally local single-user mode. A user first seen through the
header is created. A browser sends the header (and needs nothing in local mode) from
any page, so those two accept a state change only if no other site can have sent it
(``omnigent_site.cross_site``); a login session has Django's CSRF check instead.
"""

from __future__ import annotations

import ipaddress
import logging
from functools import lru_cache
from typing import TYPE_CHECKING, cast

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from omnigent_site.cross_site import check_ambient_identity
from omnigent_site.users import get_or_create_user
from omnigent_site.utf8_input import NotUtf8, header_text

if TYPE_CHECKING:
    from django.contrib.auth.models import User as AuthUser

log = logging.getLogger(__name__)


def header_meta_key(header: str) -> str:
    return "HTTP_" + header.upper().replace("-", "_")


@lru_cache(maxsize=8)
def _trusted_networks(
    entries: tuple[str, ...],
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    return tuple(ipaddress.ip_network(entry, strict=False) for entry in entries)


def is_trusted_proxy(remote_addr: str | None) -> bool:
    """True when no proxy list is configured, or the peer is on it."""
    entries = tuple(settings.OMNIGENT_TRUSTED_PROXIES)
    if not entries:
        return True
    try:
        address = ipaddress.ip_address((remote_addr or "").strip())
    except ValueError:
        return False
    return any(address in network for network in _trusted_networks(entries))


def client_address(request: HttpRequest) -> str:
    """The client's IP address: the TCP peer, or, when the peer is on the (non-empty)
    ``OMNIGENT_TRUSTED_PROXIES`` list, the last ``X-Forwarded-For`` hop that is not on
    it: the address the outermost trusted proxy saw. Hops a client wrote itself come
    before that one and are never taken."""
    peer = str(request.META.get("REMOTE_ADDR") or "").strip()
    if not settings.OMNIGENT_TRUSTED_PROXIES or not is_trusted_proxy(peer):
        return peer
    forwarded = str(request.META.get("HTTP_X_FORWARDED_FOR") or "")
    for hop in reversed([part.strip() for part in forwarded.split(",") if part.strip()]):
        if not is_trusted_proxy(hop):
            return hop
    return peer


def request_user(request: Request) -> AuthUser:
    """``request.user`` in a view behind ``IsAuthenticated``: never anonymous there."""
    return cast("AuthUser", request.user)


class ForwardedHeaderAuthentication(BaseAuthentication):
    """Identity from ``OMNIGENT_AUTH_HEADER`` (default ``X-Forwarded-Email``)."""

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, None] | None:
        header = settings.OMNIGENT_AUTH_HEADER
        if not header:
            return None
        value = request.META.get(header_meta_key(header), "").strip()
        if not value:
            return None
        if not is_trusted_proxy(request.META.get("REMOTE_ADDR")):
            log.warning(
                "ignored %s from untrusted peer %s", header, request.META.get("REMOTE_ADDR")
            )
            return None
        try:
            # The header's bytes are UTF-8 (an internationalised address), not Latin-1.
            value = header_text(value, header)
        except NotUtf8 as exc:
            raise exceptions.ParseError(str(exc)) from None
        User = get_user_model()
        max_length = User._meta.get_field("username").max_length or 150
        if len(value) > max_length:
            raise exceptions.AuthenticationFailed(
                f"{header} is longer than {max_length} characters"
            )
        check_ambient_identity(request)
        user = get_or_create_user(value)
        if not user.is_active:
            raise exceptions.AuthenticationFailed("user is inactive")
        return user, None

    def authenticate_header(self, request: Request) -> str:
        # Any value makes DRF answer 401 (not 403) when no identity is given.
        return settings.OMNIGENT_AUTH_HEADER or "Token"


class LocalSingleUserAuthentication(BaseAuthentication):
    """In local single-user mode a request without identity acts as ``local``."""

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, None] | None:
        if not settings.OMNIGENT_LOCAL_SINGLE_USER:
            return None
        check_ambient_identity(request)
        return get_or_create_user(settings.OMNIGENT_LOCAL_USER), None
