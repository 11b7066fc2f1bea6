"""`llmgw ctl members` (the control planes as a table; unknown is `-`), `members add|remove`
(the requests they send, the refusals they show) and `ctl status` when there is no leader."""

from __future__ import annotations

import json
from typing import Any

from ctl_fakes import FakeApi, columns, ctl

A, B, C = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"

MEMBERS = {
    "self": B,
    "leader": A,
    "leader_url": "http://10.0.0.1:8081",
    "member_change": None,
    "members": [
        {"id": A, "admin_url": "http://10.0.0.1:8081", "role": "leader", "state": "healthy", "reason": "",
         "commit_index": 120, "applied_index": 120, "lag": 0, "last_contact_age_s": 0.25,
         "state_hash": "sha256:0123456789abcdef0123"},
        {"id": B, "admin_url": "http://10.0.0.2:8081", "role": "standby", "state": "catching up",
         "reason": "250 entries behind the leader's commit index", "commit_index": 120, "applied_index": 0,
         "lag": 120, "last_contact_age_s": 0.0, "state_hash": "sha256:fedcba9876543210fedc"},
        # a member that did not answer: nothing about it is known but its address and why
        {"id": C, "admin_url": None, "role": None, "state": "missing", "reason": "no answer within 1 s",
         "commit_index": None, "applied_index": None, "lag": None, "last_contact_age_s": None, "state_hash": None},
    ],
    "warnings": [f"control plane {C} is missing: no answer within 1 s"],
}


def test_members_lists_every_member_and_shows_unknowns_as_dashes() -> None:
    r = ctl(["members"], FakeApi().on("GET", "/api/v1/cluster/members", json_body=MEMBERS))
    assert r.rc == 0, r.err
    assert r.out.splitlines()[0] == f"leader: {A} (http://10.0.0.1:8081)   asked: {B}"
    rows = columns(r.out, "MEMBER ")
    assert rows[0] == ["MEMBER", "ADMIN URL", "ROLE", "STATE", "COMMIT", "APPLIED", "LAG", "LAST CONTACT",
                       "STATE HASH", "REASON"]
    assert rows[1] == [A, "http://10.0.0.1:8081", "leader", "healthy", "120", "120", "0", "0.2 s ago",
                       "sha256:0123456789ab", "-"]
    assert rows[2][3:7] == ["catching up", "120", "0", "120"], "an applied index of 0 is known: shown as 0"
    assert rows[3] == [C, "-", "-", "missing", "-", "-", "-", "-", "-", "no answer within 1 s"]
    assert f"  ! control plane {C} is missing" in r.out


def test_members_json_is_the_api_document() -> None:
    r = ctl(["--json", "members"], FakeApi().on("GET", "/api/v1/cluster/members", json_body=MEMBERS))
    assert json.loads(r.out) == MEMBERS


def test_members_add_and_remove_send_one_change_each() -> None:
    api = (FakeApi()
           .on("POST", "/api/v1/cluster/members", 201, json_body={"added": "10.0.0.4:7000",
                                                                   "members": [A, B, C, "10.0.0.4:7000"]})
           .on("DELETE", "/api/v1/cluster/members/10.0.0.4%3A7000", json_body={"removed": "10.0.0.4:7000",
                                                                                "members": [A, B, C]}))
    added = ctl(["members", "add", "10.0.0.4:7000"], api)
    removed = ctl(["members", "remove", "10.0.0.4:7000"], api)
    assert (added.rc, removed.rc) == (0, 0), added.err + removed.err
    assert added.out.strip() == f"added 10.0.0.4:7000; the group is now: {A}, {B}, {C}, 10.0.0.4:7000"
    assert removed.out.startswith(f"removed 10.0.0.4:7000; the group is now: {A}, {B}, {C}. Stop its process")
    post, delete = api.requests
    assert json.loads(post.content) == {"raft_addr": "10.0.0.4:7000"}
    assert post.headers["idempotency-key"] and delete.headers["idempotency-key"], "writes carry a key"


def test_a_refused_change_is_one_error_line() -> None:
    words = "another membership change is in progress (adding 10.0.0.4:7000): one at a time; retry once it is done"
    api = FakeApi().on("DELETE", f"/api/v1/cluster/members/{C.replace(':', '%3A')}", 409,
                       json_body={"error": {"code": "membership_change_in_progress", "message": words}})
    r = ctl(["members", "remove", C], api)
    assert r.rc == 1 and r.out == ""
    assert r.err.strip() == f"error: membership_change_in_progress: {words}"


def test_status_without_a_leader_shows_the_members_as_this_one_sees_them() -> None:
    no_leader: dict[str, Any] = {"error": {"code": "no_leader", "message": "no leader is elected now ..."}}
    alone = {**MEMBERS, "leader": None, "leader_url": None}
    api = (FakeApi().on("GET", "/api/v1/status", 503, json_body=no_leader)
           .on("GET", "/api/v1/cluster/members", json_body=alone))
    r = ctl(["status"], api)
    assert r.rc == 1
    assert r.out.splitlines()[0] == f"leader: -   asked: {B}" and columns(r.out, "MEMBER ")[3][3] == "missing"
    assert r.err.strip() == "error: no_leader: no leader is elected now ..."


def test_status_passes_other_refusals_through_without_asking_more() -> None:
    api = FakeApi().on("GET", "/api/v1/status", 401, json_body={"error": {"code": "unauthorized", "message": "no"}})
    r = ctl(["status"], api)
    assert r.rc == 1 and [q.url.path for q in api.requests] == ["/api/v1/status"]
