"""The shared token of servers bound beyond loopback, and how a gRPC client presents it.

AutoGen's gRPC worker offers no hook for call metadata, but it passes channel options through: the
token rides in the channel's user agent, which the host reads from every call's metadata.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any

AGENT_PREFIX = "maxkernel-token/"


class HostUnreachable(ConnectionError):
    """The gRPC host a worker or client was pointed at is not there (or turned it away): the user's to fix."""


LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost"})


def host_of(address: str) -> str:
    """``host`` of ``host:port`` or ``[v6]:port``."""
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return host.strip("[]")


def is_loopback(address: str) -> bool:
    host = host_of(address)
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def channel_options(token: str) -> list[tuple[str, Any]]:
    """gRPC channel options that present ``token`` (none when there is no token)."""
    return [("grpc.primary_user_agent", f"{AGENT_PREFIX}{token}")] if token else []


def presented(user_agent: str) -> str:
    """The token inside a user agent string, or ''."""
    for part in user_agent.split():
        if part.startswith(AGENT_PREFIX):
            return part.removeprefix(AGENT_PREFIX)
    return ""


def matches(given: str, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())
