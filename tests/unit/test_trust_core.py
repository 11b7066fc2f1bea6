"""Trust between machines, the pure facts and the CA: a join token is used once, for its role and
name, before it expires; a revoked machine's certificates are refused; a certificate names its
machine; the check of a peer's certificate refuses every credential but the right one."""

from __future__ import annotations

from dataclasses import replace

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from hypothesis import given, settings
from hypothesis import strategies as st

from llmgw.domain import commands
from llmgw.domain.codec import state_from_json, state_to_json
from llmgw.domain.commands import trust as tc
from llmgw.domain.state import ClusterState
from llmgw.domain.trust import hash_token, machine_id, new_token, new_token_id
from llmgw.trust import ca
from llmgw.trust.peer import PeerRefused, authorize

NOW = 1_800_000_000.0
SECRET = "s" * 43


@pytest.fixture(scope="module")
def authority() -> tuple[ca.Issued, ca.Issued]:
    root = ca.make_root("test", NOW)
    return root, ca.make_intermediate(root, NOW)


def with_ca(root: ca.Issued, inter: ca.Issued, state: ClusterState = ClusterState()) -> tuple[ClusterState, str]:
    aid = ca.serial_hex(ca.load_cert(inter.cert_pem))
    state, _ = commands.apply(state, tc.ca_add(aid, inter.cert_pem, ca.seal(inter.key_pem, SECRET), root.cert_pem,
                                               ca.not_after(inter.cert_pem), NOW))
    return state, aid


def token_state(role: str = "agent", name: str = "", ttl: float = 3600) -> tuple[ClusterState, str]:
    token = new_token()
    state, _ = commands.apply(ClusterState(), tc.token_add(hash_token(token), new_token_id(), role, NOW + ttl, NOW,
                                                           name=name))
    return state, token


def issued(state: ClusterState, aid: str, token: str, *, role: str = "agent", name: str = "n1",
           serial: str = "abc", at: float = NOW + 1) -> ClusterState:
    state, _ = commands.apply(state, tc.issue(role, name, serial, NOW + 86400, aid, at, token_hash=hash_token(token)))
    return state


def test_a_join_token_is_used_once(authority: tuple[ca.Issued, ca.Issued]) -> None:
    state, token = token_state()
    state, aid = with_ca(*authority, state)
    state = issued(state, aid, token)
    assert state.machines[machine_id("agent", "n1")].serials == ("abc",)
    with pytest.raises(commands.CommandError) as refused:
        issued(state, aid, token, name="n2", serial="abd")
    assert refused.value.code == "invalid_join_token" and "already used" in refused.value.message


@pytest.mark.parametrize(("role", "name", "at", "code"), [
    ("gateway", "n1", NOW + 1, "join_token_role"),
    ("agent", "other", NOW + 1, "join_token_name"),
    ("agent", "n1", NOW + 3601, "invalid_join_token"),
])
def test_a_join_token_is_for_its_role_and_name_until_it_expires(authority: tuple[ca.Issued, ca.Issued], role: str,
                                                                name: str, at: float, code: str) -> None:
    state, token = token_state(name="n1")
    state, aid = with_ca(*authority, state)
    with pytest.raises(commands.CommandError) as refused:
        issued(state, aid, token, role=role, name=name, at=at)
    assert refused.value.code == code


def test_an_unknown_token_and_an_unknown_authority_are_refused(authority: tuple[ca.Issued, ca.Issued]) -> None:
    state, aid = with_ca(*authority)
    with pytest.raises(commands.CommandError, match="not known"):
        issued(state, aid, new_token())
    state2, token = token_state()
    with pytest.raises(commands.CommandError) as refused:
        issued(state2, "ffff", token)
    assert refused.value.code == "unknown_authority"


def test_a_token_expires_after_it_is_made() -> None:
    """Its longest life is the admin API's to bound (the timeouts table): tests/integration/test_trust_renewal.py."""
    with pytest.raises(commands.CommandError) as refused:
        commands.apply(ClusterState(), tc.token_add(hash_token(new_token()), new_token_id(), "agent", NOW, NOW))
    assert refused.value.code == "invalid_ttl"


def test_revoking_a_machine_revokes_each_of_its_certificates_and_forgets_it(
        authority: tuple[ca.Issued, ca.Issued]) -> None:
    state, token = token_state()
    state, aid = with_ca(*authority, state)
    state = issued(state, aid, token)
    state, _ = commands.apply(state, tc.issue("agent", "n1", "abd", NOW + 86400, aid, NOW + 2))  # a renewal
    assert state.machines[machine_id("agent", "n1")].serials == ("abc", "abd")
    state, result = commands.apply(state, tc.revoke("agent", "n1", NOW + 3))
    assert result["revoked"] == ["abc", "abd"] and set(state.revoked) == {"abc", "abd"}
    assert machine_id("agent", "n1") not in state.machines
    with pytest.raises(commands.CommandError) as again:
        commands.apply(state, tc.issue("agent", "n1", "abc", NOW + 86400, aid, NOW + 4))
    assert again.value.code == "revoked"
    # kept until the certificate would have expired anyway, then dropped at the next revocation
    state, _ = commands.apply(state, tc.issue("agent", "n2", "bbb", NOW + 10 * 86400, aid, NOW + 5))
    state, _ = commands.apply(state, tc.revoke("agent", "n2", NOW + 2 * 86400))
    assert set(state.revoked) == {"bbb"}


def test_a_rotation_keeps_the_old_authority_trusted_and_makes_the_new_one_sign(
        authority: tuple[ca.Issued, ca.Issued]) -> None:
    root, first = authority
    state, old = with_ca(root, first)
    second = ca.make_intermediate(root, NOW + 10)
    state, new = with_ca(root, second, state)
    assert state.authorities[old].active is False and state.authorities[new].active is True
    assert set(state.authorities) == {old, new}


def test_the_trust_facts_survive_a_snapshot(authority: tuple[ca.Issued, ca.Issued]) -> None:
    state, token = token_state()
    state, aid = with_ca(*authority, state)
    state = issued(state, aid, token)
    state, _ = commands.apply(state, tc.revoke("agent", "n1", NOW + 3))
    assert state_from_json(state_to_json(state)) == state


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["agent", "gateway"]), st.sampled_from(["a", "b", "c"]),
                          st.floats(0, 7200)), min_size=1, max_size=12))
def test_however_many_machines_race_one_token_one_gets_a_certificate(tries: list[tuple[str, str, float]]) -> None:
    """Property: whatever order and time the joins with one token arrive in, at most one applies."""
    state, token = token_state(role="agent", ttl=3600)
    state = replace(state, authorities=with_ca(ROOT, INTER)[0].authorities)
    aid = next(iter(state.authorities))
    applied = 0
    for i, (role, name, dt) in enumerate(tries):
        try:
            state = issued(state, aid, token, role=role, name=name, serial=format(i + 1, "x"), at=NOW + dt)
            applied += 1
        except commands.CommandError:
            pass
    assert applied <= 1
    assert all(m.role == "agent" for m in state.machines.values())


ROOT = ca.make_root("prop", NOW)
INTER = ca.make_intermediate(ROOT, NOW)


# -- the CA ---------------------------------------------------------------------------------------


def test_a_certificate_names_its_machine_whatever_the_request_says(authority: tuple[ca.Issued, ca.Issued]) -> None:
    root, inter = authority
    key = ca.new_key_pem()
    csr = ca.make_request(key, "control", "i-am-the-leader")  # the subject a machine asks for is ignored
    cert = ca.sign_request(csr, inter, role="agent", name="gpu-7", hosts=("10.0.0.7", "gpu-7.lan"), now=NOW)
    who = ca.identity(cert, {"i": ca.load_cert(inter.cert_pem)})
    assert (who.role, who.name, who.issuer_serial) == ("agent", "gpu-7", "i")
    alt = ca.load_cert(cert).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(a) for a in alt.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert alt.get_values_for_type(x509.DNSName) == ["gpu-7.lan"]
    assert who.not_after == pytest.approx(NOW + ca.MACHINE_LIFE)


def test_a_request_signed_by_another_key_is_refused(authority: tuple[ca.Issued, ca.Issued]) -> None:
    _, inter = authority
    csr = ca.make_request(ca.new_key_pem(), "agent", "n")
    forged = csr.replace(csr.splitlines()[5], csr.splitlines()[5][:-4] + "AAAA")
    with pytest.raises(ca.CaError):
        ca.sign_request(forged, inter, role="agent", name="n", hosts=(), now=NOW)


def test_the_intermediates_key_opens_only_with_the_cluster_secret(authority: tuple[ca.Issued, ca.Issued]) -> None:
    _, inter = authority
    sealed = ca.seal(inter.key_pem, SECRET)
    assert inter.key_pem not in sealed and ca.unseal(sealed, SECRET) == inter.key_pem
    with pytest.raises(ca.CaError, match="cluster secret"):
        ca.unseal(sealed, "t" * 43)


# -- a peer's certificate --------------------------------------------------------------------------


def machine(state: ClusterState, aid: str, inter: ca.Issued, role: str, name: str, *, now: float = NOW,
            record: bool = True) -> tuple[ClusterState, bytes]:
    cert = ca.sign_request(ca.make_request(ca.new_key_pem(), role, name), inter, role=role, name=name, hosts=(),
                           now=now)
    who = ca.identity(cert)
    if record:
        state, _ = commands.apply(state, tc.issue(role, name, who.serial, who.not_after, aid, now))
    return state, ca.load_cert(cert).public_bytes(serialization.Encoding.DER)


def test_only_the_right_certificate_admits_a_machine(authority: tuple[ca.Issued, ca.Issued]) -> None:
    root, inter = authority
    state, aid = with_ca(root, inter)
    state, agent = machine(state, aid, inter, "agent", "n1")
    state, gateway = machine(state, aid, inter, "gateway", "g1")
    other_root = ca.make_root("other", NOW)
    _, foreign = machine(state, aid, ca.make_intermediate(other_root, NOW), "agent", "n1", record=False)
    state, stale = machine(state, aid, inter, "agent", "old", now=NOW - ca.MACHINE_LIFE - 10)
    _, unrecorded = machine(state, aid, inter, "agent", "n9", record=False)

    assert authorize(agent, state, NOW, role="agent").name == "n1"
    cases = {"no certificate": (None, "unauthorized"), "a gateway's as an agent": (gateway, "forbidden"),
             "another CA's": (foreign, "unauthorized"), "an expired one": (stale, "unauthorized"),
             "one never recorded": (unrecorded, "revoked")}
    for what, (cert, code) in cases.items():
        with pytest.raises(PeerRefused) as refused:
            authorize(cert, state, NOW, role="agent")
        assert refused.value.code == code, what
    revoked, _ = commands.apply(state, tc.revoke("agent", "n1", NOW))
    with pytest.raises(PeerRefused) as refused:
        authorize(agent, revoked, NOW, role="agent")
    assert refused.value.code == "revoked"
