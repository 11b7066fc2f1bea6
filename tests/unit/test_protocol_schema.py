"""The agent ↔ control messages (`llmgw.wire.protocol_agent`): each type read into its typed value,
each malformed one refused with a reason that names the field, unknown types passed on as such."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.domain.observed import Gpu, NodeInfo, ReplicaObs
from llmgw.wire import protocol_agent as pa
from llmgw.wire.protocol import ProtocolError

MODEL = {"name": "demo", "engine": "sim", "source": "sim://demo"}
START = {"type": "start_replica", "replica_id": "demo-r1", "model": MODEL, "gpus": [0, 1]}


def test_a_start_is_read_into_its_typed_value() -> None:
    msg = pa.read_down(START)
    assert msg == pa.StartReplica("demo-r1", MODEL, (0, 1), None)
    grouped = pa.read_down({**START, "group": {"rank": 0, "size": 3, "leader": "10.0.0.1:29500",
                                                "address": "10.0.0.1:29500",
                                                "members": ["10.0.0.2:29500", "10.0.0.3:29500"]}})
    assert isinstance(grouped, pa.StartReplica)
    assert grouped.group == pa.GroupSpec(0, 3, "10.0.0.1:29500", ("10.0.0.2:29500", "10.0.0.3:29500"),
                                         "10.0.0.1:29500")
    member = pa.read_down({**START, "group": {"rank": 2, "size": 3, "leader": "10.0.0.1:29500"}})
    assert isinstance(member, pa.StartReplica) and member.group == pa.GroupSpec(2, 3, "10.0.0.1:29500")
    assert pa.read_down({**START, "gpus": []}) == pa.StartReplica("demo-r1", MODEL, (), None)  # a CPU replica
    fetched = pa.read_down({**START, "mirror": {"name": "tiny", "sha256": "ab" * 32, "size": 10,
                                                "urls": ["https://10.0.0.1:7400/mirror/blobs/" + "ab" * 32]}})
    assert isinstance(fetched, pa.StartReplica) and fetched.mirror == pa.MirrorSource(
        "tiny", "ab" * 32, 10, ("https://10.0.0.1:7400/mirror/blobs/" + "ab" * 32,))


@pytest.mark.parametrize(("change", "field"), [
    ({"replica_id": None}, "start_replica.replica_id: missing"),
    ({"replica_id": 7}, "start_replica.replica_id: must be a string"),
    ({"replica_id": "../../etc/cron.d/x"}, "start_replica.replica_id: '../../etc/cron.d/x' is not an id"),
    ({"replica_id": ".hidden"}, "start_replica.replica_id"),
    ({"replica_id": "a/b"}, "start_replica.replica_id"),
    ({"replica_id": "x" * 201}, "start_replica.replica_id"),
    ({"model": None}, "start_replica.model: missing"),
    ({"model": "demo"}, "start_replica.model: must be an object"),
    ({"model": {"name": "demo"}}, "start_replica.model: not a valid definition"),
    ({"gpus": "0"}, "start_replica.gpus: must be a list"),
    ({"gpus": [0, "1"]}, "start_replica.gpus[1]: must be a GPU index"),
    ({"gpus": [True]}, "start_replica.gpus[0]"),
    ({"gpus": [-1]}, "start_replica.gpus[0]"),
    ({"gpus": [2, 2]}, "names a GPU twice"),
    ({"group": []}, "start_replica.group: must be an object"),
    ({"group": {"size": 2, "leader": "h:1"}}, "start_replica.group.rank: missing"),
    ({"group": {"rank": 0, "size": 1, "leader": "h:1"}}, "start_replica.group.size: a group has 2 nodes or more"),
    ({"group": {"rank": 2, "size": 2, "leader": "h:1"}}, "start_replica.group.rank: must be 0..1"),
    ({"group": {"rank": -1, "size": 2, "leader": "h:1"}}, "start_replica.group.rank"),
    ({"group": {"rank": 0, "size": 2, "leader": "h"}}, "start_replica.group.leader: 'h' is not HOST:PORT"),
    ({"group": {"rank": 0, "size": 2, "leader": "h:99999"}}, "start_replica.group.leader"),
    ({"group": {"rank": 0, "size": 2, "leader": "h:1", "members": "h:2"}}, "start_replica.group.members: must be"),
    ({"group": {"rank": 0, "size": 2, "leader": "h:1", "members": [1]}}, "start_replica.group.members[0]"),
    ({"group": {"rank": 0, "size": 2, "leader": "h:1", "members": ["gpu-2"]}}, "start_replica.group.members[0]"),
    ({"group": {"rank": 1, "size": 2, "leader": "h:1", "address": "h"}}, "start_replica.group.address"),
    ({"mirror": "tiny"}, "start_replica.mirror: must be an object"),
    ({"mirror": {"name": "t", "sha256": "AB" * 32, "size": 1, "urls": ["http://h/x"]}}, "start_replica.mirror.sha256"),
    ({"mirror": {"name": "t", "sha256": "ab" * 32, "size": -1, "urls": ["http://h/x"]}}, "start_replica.mirror.size"),
    ({"mirror": {"name": "t", "sha256": "ab" * 32, "size": 1, "urls": []}}, "start_replica.mirror.urls"),
    ({"mirror": {"name": "t", "sha256": "ab" * 32, "size": 1, "urls": ["file:///etc/passwd"]}},
     "start_replica.mirror.urls"),
    ({"mirror": {"sha256": "ab" * 32, "size": 1, "urls": ["http://h/x"]}}, "start_replica.mirror.name: missing"),
])
def test_a_malformed_start_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    message = {k: v for k, v in {**START, **change}.items() if v is not None}
    with pytest.raises(ProtocolError) as e:
        pa.read_down(message)
    assert field in str(e.value)


def test_the_other_down_messages() -> None:
    assert pa.read_down({"type": "stop_replica", "replica_id": "demo-r1"}) == pa.StopReplica("demo-r1")
    with pytest.raises(ProtocolError, match="stop_replica.replica_id: missing"):
        pa.read_down({"type": "stop_replica"})
    assert pa.read_down({"type": "welcome", "node": "n1", "leader": "m1"}) == pa.Welcome("n1", "m1")
    with pytest.raises(ProtocolError, match="welcome.leader: must be a string"):
        pa.read_down({"type": "welcome", "node": "n1", "leader": 3})
    assert pa.read_down({"type": "refused", "reason": "not the leader", "leader": "m2",
                         "leader_url": "http://m2:8081"}) == pa.Refused("not the leader", "m2", "http://m2:8081")
    assert pa.read_down({"type": "refused"}) == pa.Refused("", None, None)
    assert pa.read_down({"type": "heartbeat"}) == pa.Heartbeat()
    assert pa.read_down({"type": "rejected", "message_type": "replicas", "reason": "bad",
                         "replica_id": "../x"}) == pa.Rejected("replicas", "bad", None)


def test_unknown_types_are_passed_on_as_such_both_ways() -> None:
    assert pa.read_down({"type": "drain_node", "whatever": 1}) == pa.Unknown("drain_node")
    assert pa.read_up({"type": "metrics"}, "n1") == pa.Unknown("metrics")
    with pytest.raises(ProtocolError, match="type"):
        pa.read_down({"type": 5})


def test_the_up_messages() -> None:
    assert pa.read_up({"type": "hello", "protocol": 1, "node": "gpu-7", "version": "0.3"}, "") == \
        pa.Hello(1, "gpu-7", "0.3")
    for bad, field in (({"protocol": "1"}, "hello.protocol"), ({"node": "a/b"}, "hello.node"),
                       ({"node": None}, "hello.node: missing"), ({"version": 3}, "hello.version")):
        msg = {k: v for k, v in {"type": "hello", "protocol": 1, "node": "n", "version": "", **bad}.items()
               if v is not None}
        with pytest.raises(ProtocolError, match=field):
            pa.read_up(msg, "")
    assert pa.read_up({"type": "hello", "protocol": 1, "node": "n"}, "") == pa.Hello(1, "n", ""), "version: optional"
    info = NodeInfo("ignored", cpus=4, gpus=(Gpu(0, "GPU-1", "H100", "h100-80g", 80 << 30, None),),
                    storage=({"path": "/m", "fabric": "ib", "shared": False, "models": []},),
                    reserved_gpus=(0,), reserved_memory=1 << 30, reserved_vram=2 << 30)
    read = pa.read_up({"type": "inventory", "inventory": info.to_doc()}, "n1")
    assert read == pa.Inventory(NodeInfo.from_doc({**info.to_doc(), "node": "n1"})), "the hello's name wins"
    obs = ReplicaObs("demo-r1", "demo", "other", "ready", "http://h:1")
    assert pa.read_up({"type": "replicas", "replicas": [obs.to_doc()]}, "n1") == \
        pa.Replicas((ReplicaObs("demo-r1", "demo", "n1", "ready", "http://h:1"),))
    assert pa.read_up({"type": "heartbeat"}, "n1") == pa.Heartbeat()


@pytest.mark.parametrize(("message", "field"), [
    ({"type": "inventory"}, "inventory.inventory: missing"),
    ({"type": "inventory", "inventory": {"cpus": "8"}}, "inventory.cpus: must be int"),
    ({"type": "inventory", "inventory": {"cpus": True}}, "inventory.cpus"),
    ({"type": "inventory", "inventory": {"gpus": {}}}, "inventory.gpus: must be list"),
    ({"type": "inventory", "inventory": {"gpus": [1]}}, "inventory.gpus[0]: must be an object"),
    ({"type": "inventory", "inventory": {"gpus": [{"uuid": "GPU-1"}]}}, "inventory.gpus[0].index: missing"),
    ({"type": "inventory", "inventory": {"gpus": [{"index": "0"}]}}, "inventory.gpus[0].index: must be an integer"),
    ({"type": "inventory", "inventory": {"storage": ["/m"]}}, "inventory.storage[0]: must be an object"),
    ({"type": "inventory", "inventory": {"engine_versions": []}}, "inventory.engine_versions"),
    ({"type": "inventory", "inventory": {"reserved_gpus": ["0"]}}, "inventory.reserved_gpus[0]: must be an integer"),
    ({"type": "inventory", "inventory": {"reserved_memory": 1.5}}, "inventory.reserved_memory: must be int"),
    ({"type": "replicas"}, "replicas.replicas: missing"),
    ({"type": "replicas", "replicas": [{"replica_id": "r1", "state": "dancing"}]}, "replicas[0].state"),
    ({"type": "replicas", "replicas": [{"state": "ready"}]}, "replicas[0].replica_id: missing"),
    ({"type": "replicas", "replicas": [{"replica_id": "r1", "state": "ready", "since": "x"}]}, "replicas[0]"),
])
def test_a_malformed_report_is_refused_naming_the_field(message: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as e:
        pa.read_up(message, "n1")
    assert field in str(e.value)


def test_a_rejection_carries_a_readable_replica_id_only() -> None:
    assert pa.replica_id_of({"replica_id": "demo-r1"}) == "demo-r1"
    assert pa.replica_id_of({"replica_id": "../x"}) is None
    assert pa.replica_id_of({}) is None
    assert pa.Rejected("start_replica", "why", "demo-r1").to_doc() == {
        "type": "rejected", "message_type": "start_replica", "reason": "why", "replica_id": "demo-r1"}


def test_an_upgrade_and_the_release_a_hello_reports() -> None:
    """`ctl upgrade`: control asks for a release by sha256 (or the one ran before); an agent's hello says which
    file it runs, by sha256 (or none, with why)."""
    sha = "ab" * 32
    assert pa.read_down({"type": "upgrade_agent", "sha256": sha}) == pa.UpgradeAgent(sha, False)
    assert pa.read_down({"type": "upgrade_agent", "rollback": True}) == pa.UpgradeAgent(None, True)
    for bad in ({}, {"sha256": sha, "rollback": True}, {"rollback": False}, {"rollback": 1}, {"sha256": "AB" * 32},
                {"sha256": "../x"}):
        with pytest.raises(ProtocolError, match="upgrade_agent"):
            pa.read_down({"type": "upgrade_agent", **bad})
    hello = {"type": "hello", "protocol": 1, "node": "n", "version": "0.3"}
    assert pa.read_up({**hello, "release_sha256": sha}, "") == pa.Hello(1, "n", "0.3", sha)
    assert pa.read_up({**hello, "release_sha256": None, "release_reason": "not a zipapp"}, "") == \
        pa.Hello(1, "n", "0.3", None, "not a zipapp")
    for bad_hello, field in (({"release_sha256": "x"}, "hello.release_sha256"),
                             ({"release_reason": 3}, "hello.release_reason")):
        with pytest.raises(ProtocolError, match=field):
            pa.read_up({**hello, **bad_hello}, "")
