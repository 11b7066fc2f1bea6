"""Small network helpers shared by the roles: free ports and URL hosts."""

from __future__ import annotations

import ipaddress
import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on `host` now (another process may still take it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url_host(host: str) -> str:
    """`::1` -> `[::1]`, so it can stand in a URL before `:port`."""
    return f"[{host}]" if ":" in host else host


def off_loopback(host: str) -> bool:
    """Whether a listener bound to `host` is reachable beyond this machine (a wildcard, an interface's
    address, a name other than localhost): such a listener serves TLS."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return True
