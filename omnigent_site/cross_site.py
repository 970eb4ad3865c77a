"""Refusing what a page on another site can make a browser send in the user's name.

Behind an authenticating proxy the browser's requests carry the identity header
whichever page sent them, and in local single-user mode a request needs no identity at
all: a form on any site could act as the user. Django's CSRF check protects only a
login session (DRF's ``SessionAuthentication`` runs it), so the header and local
authenticators (``omnigent_site.authentication``) apply these two rules to every
state-changing request before they accept the identity (security.md, "Requests from
other sites"):

- ``refuse_other_sites``: 403 when the browser says the request comes from another
  site: ``Sec-Fetch-Site: cross-site`` or ``same-site``, or an ``Origin`` that is not
  this server's (its host and port, or one of ``CSRF_TRUSTED_ORIGINS``). The compatible
  clients' ``Origin: omnigent://internal`` is not a browser origin and passes; clients
  that are not browsers send neither header and pass.
- ``require_parsable_body``: 415 when a body is not of a type the endpoint parses. API
  endpoints parse JSON only (``DEFAULT_PARSER_CLASSES``); the documented uploads add
  multipart. An HTML form can send neither JSON nor, without a preflight, a JSON content
  type, so a forged form never reaches a view, even one that reads no body.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from django.conf import settings
from rest_framework.exceptions import PermissionDenied, UnsupportedMediaType
from rest_framework.request import Request

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# What the compatible clients send on every request (http-api.md, "Client quirks").
COMPAT_ORIGINS = frozenset({"omnigent://internal"})
_OTHER_SITE = frozenset({"cross-site", "same-site"})


def is_own_origin(request: Request, origin: str) -> bool:
    """Whether ``origin`` is this server's: its host and port, whatever the scheme (a
    TLS-terminating proxy makes an ``https`` page's requests arrive as ``http``)."""
    origin = origin.strip()
    if origin in COMPAT_ORIGINS or origin in settings.CSRF_TRUSTED_ORIGINS:
        return True
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False  # "null" (a sandboxed frame, a redirect), a file or extension page
    return parts.netloc.lower() == request.get_host().lower()


def refuse_other_sites(request: Request) -> None:
    """403 for a state change a browser marks as sent by a page of another site."""
    if request.method not in STATE_CHANGING:
        return
    fetch_site = request.META.get("HTTP_SEC_FETCH_SITE", "").strip().lower()
    origin = request.META.get("HTTP_ORIGIN")
    if fetch_site in _OTHER_SITE or (origin is not None and not is_own_origin(request, origin)):
        raise PermissionDenied("a request from a page of another site cannot change anything here")


def has_body(request: Request) -> bool:
    meta = request.META
    if meta.get("HTTP_TRANSFER_ENCODING"):
        return True
    try:
        return int(meta.get("CONTENT_LENGTH") or 0) > 0
    except ValueError:
        return True


def require_parsable_body(request: Request) -> None:
    """415 for a state change whose body the endpoint's parsers do not take."""
    if request.method not in STATE_CHANGING:
        return
    media = request.content_type or ""
    if not media.strip() and not has_body(request):
        return  # nothing to parse (a bodyless POST or DELETE)
    parsers = list(request.parsers or ())
    negotiator = request.negotiator
    if negotiator is not None and negotiator.select_parser(request, parsers) is not None:
        return
    accepted = ", ".join(parser.media_type for parser in parsers) or "no body"
    raise UnsupportedMediaType(
        media.split(";")[0].strip() or "none",
        detail=f"Content-Type must be one of: {accepted}",
    )


def check_ambient_identity(request: Request) -> None:
    """Both rules, for a request whose identity the browser would send from any page."""
    refuse_other_sites(request)
    require_parsable_body(request)
