"""Where a webhook may send (automation.md, SSRF): public addresses over HTTPS.

A URL is judged by the addresses its host resolves to, in every spelling (``0.0.0.0``,
IPv4-mapped IPv6, decimal forms all resolve to what they are). Refused: loopback,
private, link-local (the cloud metadata address among them), shared, reserved,
multicast and unspecified addresses, unless ``OMNIGENT_WEBHOOK_ALLOW_PRIVATE``; plain
``http://`` unless ``OMNIGENT_WEBHOOK_ALLOW_HTTP`` (both on in local single-user mode).
The sender connects to the address checked here (``Target.address``), so a DNS answer
that changes between the check and the connection cannot redirect it.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from omnigent_site.domain_errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Metadata services that are not link-local (AWS's IPv6 one, Alibaba's, Oracle's).
_METADATA = {
    ipaddress.ip_address("fd00:ec2::254"),
    ipaddress.ip_address("100.100.100.200"),
    ipaddress.ip_address("192.0.0.192"),
}


class UnsafeURL(InvalidInput):
    """The URL may not be sent to (a 400 at creation; a failed attempt at send time)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    address: IPAddress
    # The path and query to request on that address.
    path: str

    @property
    def connect_url(self) -> str:
        """The URL with the checked address in place of the host name."""
        literal = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        return f"{self.scheme}://{literal}:{self.port}{self.path}"

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def allow_http() -> bool:
    return bool(settings.OMNIGENT_WEBHOOK_ALLOW_HTTP or settings.OMNIGENT_LOCAL_SINGLE_USER)


def allow_private() -> bool:
    return bool(settings.OMNIGENT_WEBHOOK_ALLOW_PRIVATE or settings.OMNIGENT_LOCAL_SINGLE_USER)


def is_public(address: IPAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address):
        mapped = address.ipv4_mapped or address.sixtofour
        if mapped is not None:
            return is_public(mapped)
        if address.teredo is not None:
            return False
    if address in _METADATA:
        return False
    return address.is_global and not address.is_multicast


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise UnsafeURL(f"the host {host!r} does not resolve", field="url") from exc
    found: list[IPAddress] = []
    for info in infos:
        # An IPv6 answer may carry a zone (``fe80::1%eth0``).
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise UnsafeURL(f"the host {host!r} does not resolve", field="url")
    return found


def parse_url(url: str) -> tuple[str, str, int, str]:
    """The scheme, host, port and path-with-query of a webhook URL, or a 400."""
    if len(url) > 2048:
        raise UnsafeURL("must be at most 2048 characters", field="url")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL("is not a valid URL", field="url") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        raise UnsafeURL("must be an https:// URL", field="url")
    if scheme == "http" and not allow_http():
        raise UnsafeURL(
            "must be an https:// URL (http:// needs OMNIGENT_WEBHOOK_ALLOW_HTTP=1)", field="url"
        )
    if parts.username is not None or parts.password is not None:
        raise UnsafeURL("must not carry a user name or password", field="url")
    host = parts.hostname or ""
    if not host:
        raise UnsafeURL("has no host", field="url")
    if any(ord(char) < 33 or ord(char) > 126 for char in url):
        raise UnsafeURL("must be ASCII without spaces (encode it)", field="url")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return scheme, host, port or (443 if scheme == "https" else 80), path


def check_url(url: str) -> Target:
    """Resolve the URL's host once and pick the address to connect to, or raise
    ``UnsafeURL`` (400 naming ``url``). Every resolved address must be allowed: a
    host with one private answer among public ones is refused."""
    scheme, host, port, path = parse_url(url)
    addresses = _resolve(host, port)
    if not allow_private():
        for address in addresses:
            if not is_public(address):
                raise UnsafeURL(
                    f"the host {host!r} resolves to a private, loopback, link-local or "
                    "metadata address, which webhooks may not call",
                    field="url",
                )
    return Target(scheme=scheme, host=host, port=port, address=addresses[0], path=path)
