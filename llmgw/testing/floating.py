"""`FakeFloatingAddress`: the floating address as a flag, with the calls made and failures to order,
and `LeaderFlag`, a leadership a test can flip (the store's `is_leader`, faked).
"""

from __future__ import annotations

from llmgw.interfaces import FloatingAddressError


class FakeFloatingAddress:
    """A `FloatingAddress` held in memory. `fail_claims` / `fail_holds` make those calls raise
    with that text; `held` can be set from outside (someone removed the address)."""

    def __init__(self, address: str = "10.213.0.100/24", interface: str = "fake0") -> None:
        self.address = address
        self.interface = interface
        self.held = False
        self.calls: list[str] = []
        self.announcements = 0
        self.fail_claims: str | None = None
        self.fail_holds: str | None = None
        self.fail_releases: str | None = None

    def describe(self) -> str:
        return f"{self.address} on {self.interface}"

    async def claim(self) -> None:
        self.calls.append("claim")
        if self.fail_claims is not None:
            raise FloatingAddressError(f"{self.describe()}: {self.fail_claims}")
        self.held = True
        self.announcements += 1

    async def release(self) -> None:
        self.calls.append("release")
        if self.fail_releases is not None:
            raise FloatingAddressError(f"{self.describe()}: {self.fail_releases}")
        self.held = False

    async def holds(self) -> bool:
        self.calls.append("holds")
        if self.fail_holds is not None:
            raise FloatingAddressError(f"{self.describe()}: {self.fail_holds}")
        return self.held


class LeaderFlag:
    """`is_leader` for a test: call it; set `.leads` to change who leads."""

    def __init__(self, leads: bool = False) -> None:
        self.leads = leads

    def __call__(self) -> bool:
        return self.leads
