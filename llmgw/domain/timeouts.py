"""Every timeout, interval and backoff of llmgw, in seconds, in one typed table.

"How long until X?" has one answer here. Roles take a `Timeouts` in their
config (default `TIMEOUTS`), so a test can shorten them all with `scaled()`.
Pure data: the core (reconcile) reads it too. docs/operations.md lists the
same table, and a test keeps the two equal.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, TypeVar

_V = TypeVar("_V")


def _t(default: float, area: str, help: str) -> Any:
    return field(default=default, metadata={"area": area, "help": help})


def overrides(spec: str, known: set[str], parse: Callable[[str], _V], unit: str, table: str,
              kind: str) -> dict[str, _V]:
    """`name=value,name=value` (an environment variable's overrides of one of the tables: LLMGW_TIMEOUTS,
    LLMGW_LIMITS) as {name: value}; ValueError naming an unknown name (`table` says where they are
    listed) or a value `parse` refuses (`kind` says what it must be, `unit` the placeholder)."""
    changes: dict[str, _V] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(f"{item!r}: give NAME={unit} with NAME one of the {table} in docs/operations.md")
        try:
            changes[name] = parse(raw)
        except ValueError:
            raise ValueError(f"{item!r}: {raw.strip()!r} is not {kind}") from None
    return changes


# Either end of an agent's stream that heard nothing for this many heartbeat intervals takes its
# peer for gone (a half-open connection, a stopped or partitioned machine).
SILENT_BEATS = 3


@dataclass(frozen=True)
class Reconnect:
    """The waits of one role's search for the leader (`llmgw.wire.follow`): the pause after a round
    in which every control URL failed starts at `first_s` and doubles up to `max_s`, at most
    `election_s` while members answer that none leads; a welcomed stream that lasted less than
    `settle_s` is followed by a pause of about `first_s` (a leader that drops it at once)."""

    first_s: float
    max_s: float
    election_s: float
    settle_s: float


@dataclass(frozen=True)
class Timeouts:
    # --- the agent's stream to the control plane ------------------------------------
    stream_heartbeat_s: float = _t(1.5, "agent", "on an agent's stream, each end (agent and leader) with nothing else to send sends a heartbeat this often; an end that heard nothing for 3 intervals (4.5 s: a vanished peer is noticed within 5 s) takes its peer for gone (the agent looks for the leader, the leader closes the stream and the node's grace period starts)")
    agent_connect_s: float = _t(5.0, "agent", "one connect (TCP and handshake) of an agent to a control plane gives up after this long (and `llmgw server add`'s check, from the new machine, that it reaches the control plane)")
    storage_rescan_s: float = _t(30.0, "agent", "an agent rescans its --storage directories this often (unchanged files are not read again) and reports its inventory again when they changed")
    inventory_refresh_s: float = _t(300.0, "agent", "an agent whose inventory did not change (GPU readings such as utilisation, temperature, power and small moves of used memory do not count: llmgw.agent.inventory.changed) sends it again this often anyway, so the leader's readings are at most this old")
    agent_reconnect_min_s: float = _t(0.2, "agent", "first wait before an agent reconnects to control (doubles, with jitter)")
    agent_reconnect_max_s: float = _t(10.0, "agent", "longest wait between an agent's reconnection attempts")
    agent_election_retry_s: float = _t(1.0, "agent", "longest wait between an agent's rounds while control planes answer but none leads (an election)")
    agent_stream_close_s: float = _t(1.0, "agent", "how long an agent waits for a clean close of its stream")
    # --- engines, as the agent supervises them ----------------------------------------
    engine_health_poll_s: float = _t(0.2, "agent", "how often a starting engine's /health is probed (after engine_health_fast_for_s)")
    engine_health_fast_poll_s: float = _t(0.02, "agent", "how often a starting engine's /health is probed in its first engine_health_fast_for_s: a small model that starts in a second is reported ready within this of its port answering (a closed port refuses at once: cheap)")
    engine_health_fast_for_s: float = _t(10.0, "agent", "how long after its start an engine's /health is probed every engine_health_fast_poll_s, before every engine_health_poll_s")
    engine_health_request_s: float = _t(2.0, "agent", "one /health probe of an engine gives up after this long")
    engine_liveness_poll_s: float = _t(1.0, "agent", "how often a ready engine's /health is probed; 3 failed probes in a row (or probes past engine_liveness_request_s) report it failed and stop it")
    engine_liveness_request_s: float = _t(3.0, "agent", "one /health probe of a ready engine gives up after this long (a hung engine: the probe counts as failed)")
    engine_start_s: float = _t(600.0, "agent", "an engine not serving this long after its start has failed (large weights load slowly)")
    mirror_fetch_connect_s: float = _t(10.0, "agent", "an agent fetching a mirror file gives a control plane this long to accept the connection before it tries the next one")
    mirror_fetch_read_s: float = _t(60.0, "agent", "a mirror file's transfer silent this long is dropped, and goes on from where it stopped (the next control plane of the list first)")
    mirror_fetch_retry_s: float = _t(5.0, "agent", "after a round of every control plane gave nothing of a mirror file, an agent waits this long before the next round (3 such rounds: the replica fails)")
    engine_exit_log_s: float = _t(0.1, "agent", "an engine that exited before serving: its log's last lines are read after this long")
    adapter_load_s: float = _t(60.0, "agent", "one LoRA adapter load asked of an engine (and the list of what it serves read after it) gives up after this long; the adapter is then reported failed on that replica")
    engine_sleep_s: float = _t(300.0, "agent", "fast wake: an engine's `POST /sleep` (vLLM moving its weights to CPU RAM) gives up after this long; the replica is then failed and stopped")
    engine_wake_s: float = _t(600.0, "agent", "fast wake: an engine's `POST /wake_up` (weights back on the GPU; reloaded from disk at sleep level 2) gives up after this long; the replica is then failed, as a failed start")
    engine_stop_grace_s: float = _t(5.0, "agent", "after SIGTERM, an engine is killed (SIGKILL) once this has passed")
    engine_parent_poll_s: float = _t(1.0, "engine", "how often an engine checks that its agent is alive (it stops when not)")
    engine_version_s: float = _t(5.0, "agent", "`llama-server --version` or `vllm --version`, run once per binary to report the engine's version, gives up after this long (the version shows as unknown)")
    gpu_probe_command_s: float = _t(10.0, "agent", "one `nvidia-smi -L` or `nvidia-smi -q -x` run by GPU discovery (or `llmgw doctor`) gives up after this long; the node then reports what it could read, with a warning")
    sim_keep_alive_s: float = _t(5.0, "engine", "the sim engine closes an idle connection after this long (upstream_idle_s stays below it)")
    sim_shutdown_grace_s: float = _t(0.5, "engine", "on stop, the sim engine's requests in flight get this long")
    sim_group_join_retry_s: float = _t(0.2, "engine", "a sim engine of rank >= 1 in a multi-node replica dials its rank 0 again this often until it answers")
    sim_group_join_s: float = _t(5.0, "engine", "a sim engine of rank 0 closes a connection that has not said which rank joins within this long")
    # --- the control plane ---------------------------------------------------------------
    reconcile_tick_s: float = _t(1.0, "control", "the reconciler runs at least this often (and on every change)")
    reconcile_startup_quiet_s: float = _t(10.0, "control", "no no-placement warning this soon after control starts (agents connect)")
    start_resend_s: float = _t(15.0, "control", "a start an agent has not acted on is sent again after this long")
    lost_node_grace_s: float = _t(30.0, "control", "a node whose stream closed keeps its placements this long")
    drain_stop_grace_s: float = _t(30.0, "control", "draining a node (`ctl nodes drain`), a replica whose replacement is ready leaves the gateways' routes at once (nothing new is sent to it) and is stopped this long after the replacement became ready: its requests in flight, streams included, finish meanwhile")
    agent_report_grace_s: float = _t(10.0, "control", "a leader that just took office (a start, a restart, an election) gives its agents this long to connect and report before it judges a model down or unplaceable or a judge down: no alarm for what their first reports heal")
    start_backoff_first_s: float = _t(1.0, "control", "wait before the next start in a replica slot whose start failed once (doubles each failure in a row)")
    start_backoff_max_s: float = _t(30.0, "control", "longest wait before the next start in a failing replica slot")
    node_avoid_s: float = _t(600.0, "control", "a node on which a model failed to start health.avoid_node_after_failures times in a row is avoided for that model this long after the last failure (placement tries the other nodes first)")
    stable_ready_s: float = _t(300.0, "control", "a replica must stay ready this long before its readiness breaks its model's row of failed starts (and clears its slot's and node's); one that fails sooner is a flap, counted as a failed start, so a model whose engines serve a moment and die parks like one whose engines never serve")
    source_facts_refresh_s: float = _t(60.0, "control", "the leader reads again the header of each model source it can open where it runs (pkg://, a local path) this often, and whenever the models change: the memory estimate of weights no storage report names")
    scale_down_delay_s: float = _t(300.0, "control", "a replica added under load is kept until the load has stayed below what needs it for this long (the leader remembers the peak of requests in flight over this window)")
    admin_keep_alive_s: float = _t(5.0, "control", "the admin API closes an idle client connection after this long")
    admin_accept_retry_s: float = _t(0.1, "control", "after a failed accept (out of file descriptors after all), the admin API waits this long before accepting again")
    restart_answer_s: float = _t(0.2, "control", "asked to restart in place (`ctl members restart`), a control plane answers, then waits this long (its answer on the way) before it stops as on SIGTERM")
    leader_handover_s: float = _t(2.0, "control", "on stop, a leading control plane waits this long for its most caught-up member to take leadership over (Raft's TimeoutNow) before it stops anyway; the others then elect after their election timeout")
    admin_shutdown_grace_s: float = _t(1.0, "control", "on stop, the admin API's open requests get this long (streams close at once)")
    admin_forward_s: float = _t(15.0, "control", "a standby waits this long for the leader's answer to a request it forwarded (longer than store_commit_s, so the leader's own answer comes first)")
    status_cache_s: float = _t(1.0, "control", "`GET /api/v1/status` answers from the summary it built last while nothing that summary reads has changed (the state, what agents report, the reconciler's views, the members, the webhooks), for this long; a request after that, while nothing but the clock moved, is answered from it at once while a new one is built beside (so its clock-derived figures, ages, idle times, ETAs, timers, are at most twice this old); a change is built before the answer")
    member_probe_s: float = _t(1.0, "control", "listing the members, each member's /api/v1/cluster/self gets this long to answer; one that does not shows as missing")
    mirror_sync_s: float = _t(5.0, "control", "each control plane looks at least this often for mirror blobs it lacks (pulled from the leader) and blobs no name refers to (deleted); a change of the catalog wakes it at once")
    mirror_pull_read_s: float = _t(30.0, "control", "a standby's pull of a mirror blob from the leader gives up when no byte arrives for this long (and resumes at the next pass)")
    member_announce_retry_s: float = _t(1.0, "control", "a member whose announcement (admin URL, version) did not commit tries again after this long")
    floating_leader_poll_s: float = _t(0.1, "control", "how often control checks whether it leads, to claim or release the floating address")
    floating_verify_s: float = _t(2.0, "control", "the floating address is checked at least this often (claimed again if removed, released if not leading)")
    floating_command_s: float = _t(5.0, "control", "one `ip` or `arping` command for the floating address gives up after this long")
    activation_load_base_s: float = _t(30.0, "control", "a start's estimate (its ETA, and the activation window a large checkpoint stretches) is this plus the checkpoint's size at activation.load_mib_per_s: an engine's own start before and after it reads the weights")
    # --- the Raft store ------------------------------------------------------------------
    store_ready_s: float = _t(30.0, "store", "a store not ready (journal replayed, leader known) this long fails the start")
    store_ready_poll_s: float = _t(0.02, "store", "while starting, how often the store checks for a leader and a replayed log")
    store_commit_s: float = _t(10.0, "store", "a write not committed this long is refused as unavailable (no quorum?)")
    store_read_s: float = _t(1.0, "store", "an admin API read on the leader waits this long for a majority of the group to confirm that this member still leads (a ReadIndex round: about a network round trip); then 503 leader_unreachable, never a possibly stale answer")
    store_close_s: float = _t(5.0, "store", "on stop, the Raft thread gets this long to finish before it is abandoned")
    raft_tick_s: float = _t(0.005, "store", "the longest wait of Raft's thread for an event (timers such as heartbeats fire at this granularity)")
    raft_heartbeat_s: float = _t(0.05, "store", "the leader sends appends or heartbeats to followers this often")
    raft_election_min_s: float = _t(0.3, "store", "shortest time without a leader before a follower stands for election")
    raft_election_max_s: float = _t(0.9, "store", "longest time without a leader before a follower stands for election")
    raft_connect_retry_s: float = _t(0.5, "store", "a member unreachable at its Raft address is dialled again this often (a member that comes back joins this fast)")
    failpoints_poll_s: float = _t(0.02, "store", "tests only (LLMGW_FAILPOINTS, llmgw/store/failpoints.py): how often a member re-reads its failpoints' control file")
    raft_connection_timeout_s: float = _t(2.0, "store", "a Raft connection that has read nothing this long is closed and dialled again (heartbeats keep a live one busy); after a heal, a connect attempt whose packets were dropped is given up this soon")
    raft_leader_fallback_s: float = _t(2.0, "store", "a leader that heard from no majority this long steps down; until then a partitioned leader still believes it leads, but serves no read (each is confirmed by a majority first: store_read_s)")
    raft_accept_pause_s: float = _t(0.1, "store", "the Raft port whose accept failed (no descriptor left: EMFILE) rests this long before it accepts again")
    raft_sweep_s: float = _t(0.1, "store", "a member checks its Raft connections this often for a handshake not finished within the connection timeout, or a silent one")
    raft_peer_recheck_s: float = _t(0.5, "store", "a member checks again this often that each TLS peer's certificate is still accepted (a revoked one is dropped within this, plus the revocation's commit)")
    raft_tls_switch_poll_s: float = _t(0.5, "control", "until the group requires TLS between its members, the leader looks this often whether every link speaks it (links change with no change of the state)")
    raft_tls_retry_s: float = _t(60.0, "store", "a Raft peer that answered no TLS (an older llmgw, in a rolling upgrade) is dialled sealed-only, then with TLS again after a wait that doubles up to this long, until the group requires TLS")
    raft_refusal_log_s: float = _t(60.0, "store", "a refused Raft peer (wrong cluster secret, not in the group) is logged at most once per this long, per address")
    # --- the gateway ---------------------------------------------------------------------
    gateway_keep_alive_s: float = _t(75.0, "gateway", "idle client connections stay open this long (longer than SDK pools keep them)")
    gateway_shutdown_grace_s: float = _t(5.0, "gateway", "on stop, requests in flight get this long to finish")
    gateway_drain_idle_s: float = _t(6.0, "gateway", "restarting in place, a gateway closes a kept-alive connection once it has been idle this long (longer than the 5 s SDK pools such as httpx's and openai's keep one: no client sends on it any more); one that carries a request meanwhile is answered with `Connection: close`")
    gateway_restart_usage_s: float = _t(5.0, "gateway", "restarting in place, once drained, a gateway waits at most this long for the leader to acknowledge the usage it has not counted yet (then it runs again, and what is left is not counted)")
    gateway_restart_drain_s: float = _t(60.0, "gateway", "restarting in place, a gateway gives the requests in flight (streams included) this long to finish before the program runs again; new connections wait in the kernel's queue meanwhile")
    log_write_interval_s: float = _t(0.05, "gateway", "log lines are queued by the serving loop and written by a thread this often, in batches (every role)")
    gateway_open_wait_s: float = _t(10.0, "gateway", "`--workers`: a worker takes connections on the shared port once it has its table from control, or after this long without one (then it answers 503 gateway_not_synced until one comes)")
    gateway_gil_switch_s: float = _t(0.0005, "gateway", "a thread holding Python's GIL (the log and request-log writers) hands it back to the serving loop after at most this long (Python's default, 5 ms, was the p99 of the gateway's added latency)")
    judge_failure_report_s: float = _t(1.0, "gateway", "a remote gateway reports a judge's failures to answer to the leader at most this often per judge (the latest words)")
    gateway_first_request_s: float = _t(10.0, "gateway", "a new client connection that sends no byte for this long is closed (between requests a kept-alive one waits gateway_keep_alive_s)")
    gateway_head_s: float = _t(10.0, "gateway", "a request head (request line and headers) must arrive whole within this long of its first byte (408, then the connection is closed)")
    gateway_body_idle_s: float = _t(30.0, "gateway", "a client that sends no byte of its request body for this long is taken for gone")
    gateway_send_s: float = _t(60.0, "gateway", "a client that takes no byte of its answer for this long is dropped (its engine request is cancelled)")
    gateway_accept_retry_s: float = _t(0.1, "gateway", "after a failed accept (out of file descriptors), the gateway waits this long before accepting again")
    gateway_close_drain_s: float = _t(2.0, "gateway", "before closing a connection with an unread request body, the gateway reads and drops it for at most this long, so the client gets the answer already sent")
    gateway_drain_body_s: float = _t(10.0, "gateway", "a refused request's unread body is discarded for at most this long")
    upstream_connect_s: float = _t(5.0, "gateway", "connecting to an engine gives up after this long (502)")
    upstream_write_s: float = _t(30.0, "gateway", "sending a request body to an engine gives up after this long")
    upstream_first_byte_s: float = _t(300.0, "gateway", "an engine that has sent no answer this long after taking a request fails it (504 upstream_timeout); a non-streamed answer comes whole when its generation ends, so this bounds the longest one")
    upstream_chunk_s: float = _t(60.0, "gateway", "an engine silent this long in the middle of an answer fails it (504 before the status is sent, an error event in a stream after)")
    upstream_refused_probe_s: float = _t(2.0, "gateway", "a replica that refused a connection is out of rotation; after this long one request tries it again (moving to another replica if it still refuses)")
    breaker_open_s: float = _t(5.0, "gateway", "a replica whose circuit breaker opened (gateway.breaker_failures failed requests in a row) gets no request this long; then one request probes it (closed again if it answers below 500)")
    upstream_idle_s: float = _t(4.0, "gateway", "idle upstream connections are closed after this long (before the engine closes them)")
    priority_promote_s: float = _t(10.0, "gateway", "a request waiting for a busy replica's slot moves up one priority class (bulk, default, interactive, system) each time it has waited this long in its class, so a lower class is slowed, never starved")
    gateway_heartbeat_s: float = _t(1.0, "gateway", "a gateway and the leader each send a heartbeat on their quiet stream this often")
    gateway_silence_s: float = _t(4.0, "gateway", "a gateway stream with no message this long is taken for dead; each side closes it (4 heartbeats: a vanished peer is noticed within 5 s)")
    activation_retry_after_s: float = _t(5.0, "gateway", "a request that does not wait for a starting model (`x-llmgw-wait`) is answered 503 model_activating with `Retry-After` its ETA, or this when there is none")
    gateway_demand_report_s: float = _t(0.25, "gateway", "a remote gateway sends its demand (activation asks, last use) to the leader this often; a request that starts waiting for an activation sends its ask at once (a model's at most once per this interval; the rest go with the next report)")
    gateway_reconnect_min_s: float = _t(0.2, "gateway", "first wait before a gateway tries the next control URL (doubles, with jitter)")
    gateway_reconnect_max_s: float = _t(5.0, "gateway", "longest wait between a gateway's attempts to reach the leader")
    gateway_election_retry_s: float = _t(1.0, "gateway", "longest wait between a gateway's rounds while control planes answer but none leads (an election)")
    gateway_table_warn_s: float = _t(30.0, "gateway", "a gateway serving from a table older than this logs its age, again every this long")
    gateway_stream_close_s: float = _t(1.0, "gateway", "how long a gateway waits for a clean close of its stream to the leader")
    gateway_worker_start_s: float = _t(30.0, "gateway", "`llmgw gateway --workers N`: a worker not ready this long after its start is stopped (at the first start, the gateway fails to start; later, it counts as a quick death)")
    gateway_worker_restart_min_s: float = _t(0.5, "gateway", "`--workers`: first wait before a worker that died is started again (doubles while it keeps dying within gateway_worker_stable_s of its start)")
    gateway_worker_restart_max_s: float = _t(30.0, "gateway", "`--workers`: longest wait before a worker that keeps dying is started again")
    gateway_worker_stable_s: float = _t(10.0, "gateway", "`--workers`: a worker that dies sooner than this after its start died quickly (its next start waits longer; 3 in a row are logged as an error)")
    gateway_worker_stop_s: float = _t(8.0, "gateway", "`--workers`: on stop, a worker still running this long after its SIGTERM is killed (below stop_deadline_s, so the gateway still exits 0)")
    gateway_worker_parent_poll_s: float = _t(1.0, "gateway", "`--workers`: how often a worker checks that its parent gateway is alive (it stops when not)")
    requestlog_flush_s: float = _t(0.5, "gateway", "a gateway writes its queued request records to its log this often (a record is visible to queries after it)")
    requestlog_prune_s: float = _t(60.0, "gateway", "a gateway removes request log segments past the retention settings this often")
    guard_verdict_ttl_s: float = _t(600.0, "gateway", "a judge's verdict on a text is reused for this long (the verdict cache, per policy, judge and text); `ctl guard judge ask` always asks afresh")
    usage_report_s: float = _t(2.0, "gateway", "a gateway sends its usage rollup deltas to the leader this often (a batch not acknowledged is sent again)")
    console_refresh_s: float = _t(5.0, "control", "an open console page asks for its fresh content this often (live updates without reloading)")
    console_session_idle_s: float = _t(28800.0, "control", "a console session (signed in with an admin or viewer key) ends this long after its last request; an open page's live updates keep it going, and revoking its key ends it at once")
    requests_query_s: float = _t(5.0, "control", "`GET /api/v1/requests` waits this long for each gateway's answer; one that did not answer is named")
    judge_failure_recent_s: float = _t(300.0, "control", "a judge's last failure to answer (reported by a gateway) is what is wrong with that judge, on `ctl guard judge status` and `ctl status`, for this long; after it, it is only shown as its last failure")
    judge_ask_s: float = _t(20.0, "control", "`ctl guard judge ask`: control waits this long for the judge replica's answer (below ctl_request_s, so ctl hears why)")
    restart_window_s: float = _t(600.0, "control", "a model's restarts (failed starts and crashes of its replicas) are counted over this window; health.restart_storm_restarts of them in it is a restart storm (`ctl status`, a webhook, an alert)")
    notify_check_s: float = _t(1.0, "control", "the leader works out the conditions (lost nodes, parked models, ...) this often and posts each start and resolution to the webhooks")
    notify_resolve_hold_s: float = _t(30.0, "control", "a condition that cleared is posted as resolved once it has stayed clear this long; back within it, nothing is posted (a flapping condition is one event)")
    notify_election_settle_s: float = _t(10.0, "control", "a new leader posts the group's own conditions (a member missing or lagging) only once it has led this long and they still hold: its Raft links to the others are still connecting after an election or a start")
    notify_post_s: float = _t(5.0, "control", "one POST of an event to a webhook gives up after this long (counted as a failed attempt)")
    notify_retry_first_s: float = _t(1.0, "control", "wait before the second attempt to deliver an event to a webhook (doubles each attempt, up to notify_retry_max_s)")
    notify_retry_max_s: float = _t(60.0, "control", "longest wait between two attempts to deliver an event to a webhook")
    # --- trust between machines (docs/security.md) --------------------------------------
    ca_root_life_s: float = _t(10 * 365 * 86400.0, "trust", "a cluster's root CA, made at its first start, is valid this long (10 years)")
    ca_intermediate_life_s: float = _t(2 * 365 * 86400.0, "trust", "an intermediate CA (made at the first start and by `ctl ca rotate`) is valid this long, never past its root")
    cert_life_s: float = _t(90 * 86400.0, "trust", "a machine's certificate is valid this long; it renews at two thirds of it over its stream")
    cert_backdate_s: float = _t(300.0, "trust", "a certificate is valid from this long before it was made, so a machine whose clock is a little behind still accepts it")
    cert_expiring_s: float = _t(7 * 86400.0, "trust", "a certificate the cluster holds this close to its end is the cert_expiring condition")
    cert_renew_retry_s: float = _t(300.0, "trust", "a machine whose renewal request was not answered (or was refused) asks again after this long")
    join_token_ttl_s: float = _t(3600.0, "trust", "a join token lives this long unless `ctl nodes token create --ttl` says otherwise")
    join_token_ttl_max_s: float = _t(30 * 86400.0, "trust", "the longest life a join token may be given")
    join_request_s: float = _t(30.0, "trust", "a machine's join (fetching the CA, sending its token and request) gives up after this long per control plane")
    trust_recheck_s: float = _t(60.0, "trust", "a control plane checks its own certificate (renewal at two thirds, a rotation's new bundle) at least this often, and at every change of the state")
    trust_ca_wait_s: float = _t(1.0, "trust", "a control plane waiting for the cluster's CA (a new group's leader makes it) looks again this often")
    revoke_notice_s: float = _t(1.0, "trust", "a stream whose machine was revoked is told why within this long, then closed")
    # --- processes and the command line ------------------------------------------------
    listener_limit_log_s: float = _t(60.0, "process", "a listener at its connection limit (docs/operations.md, Limits) logs what it closed and refused at most this often")
    stop_deadline_s: float = _t(10.0, "process", "after SIGINT/SIGTERM a process has stopped within this long, started or not")
    # --- this machine's services (`llmgw service`, docs/operations.md "Services") ----------
    service_start_s: float = _t(10.0, "service", "`llmgw service start` waits this long for the built-in supervisor to say it started the role")
    service_stop_s: float = _t(20.0, "service", "`llmgw service stop` waits this long for the role to stop (its own stop deadline included) before it kills the supervisor and the role")
    service_poll_s: float = _t(0.05, "service", "`llmgw service` and `llmgw init` look at what they wait for (the supervisor's state file, the admin API's first answer) this often")
    init_ready_s: float = _t(60.0, "service", "`llmgw init` waits this long for the control plane it started to answer over TLS (its CA and certificate made)")
    service_restart_first_s: float = _t(1.0, "service", "the built-in supervisor waits this long before starting again a role that exited (doubles each time, up to service_restart_max_s)")
    service_restart_max_s: float = _t(60.0, "service", "the longest wait of the built-in supervisor before starting again a role that keeps exiting")
    service_stable_s: float = _t(30.0, "service", "a role that ran this long before it exited is started again after the first wait (its backoff starts over)")
    # --- `llmgw server add` (docs/install.md, "From one machine to a fleet") -------------------
    ssh_connect_s: float = _t(10.0, "server add", "`llmgw server add`: ssh's ConnectTimeout; a machine that has not answered the connection within this long is unreachable")
    ssh_command_s: float = _t(60.0, "server add", "`llmgw server add`: one command run over ssh (the checks, the service's install and start) gives up after this long")
    ssh_copy_s: float = _t(600.0, "server add", "`llmgw server add`: copying the zipapp over scp gives up after this long")
    server_add_join_s: float = _t(180.0, "server add", "`llmgw server add` waits this long for the machine to have joined (an agent connected, a control plane added and caught up, a gateway following the leader), once its service started")
    server_add_poll_s: float = _t(0.5, "server add", "`llmgw server add` asks the admin API again this often while it waits for the machine to join")
    server_add_clock_skew_s: float = _t(2.0, "server add", "`llmgw server add` refuses a machine whose clock is surely further than this from the operator's machine's (beyond half the probe's round trip)")
    ctl_node_drain_s: float = _t(3600.0, "ctl", "`llmgw ctl nodes drain --wait` follows the drain this long at most (the drain itself goes on past it)")
    ctl_node_restart_s: float = _t(60.0, "ctl", "`llmgw ctl nodes restart` waits this long for the node's agent to be back on a new stream (`--no-wait`: not at all)")
    ctl_gateway_restart_s: float = _t(120.0, "ctl", "`llmgw ctl gateways restart` waits this long for the gateway to follow the leader again, restarted (its drain included: gateway_restart_drain_s; `--no-wait`: not at all)")
    ctl_member_restart_s: float = _t(60.0, "ctl", "`llmgw ctl members restart` waits this long for the member to answer again, restarted and caught up (`--no-wait`: not at all)")
    upgrade_machine_s: float = _t(300.0, "ctl", "`llmgw ctl upgrade` gives each machine this long to answer, restart into the new release and be back (a member caught up, a gateway following the leader again, an agent connected with its replicas reported) before it stops the run, saying which machine and why")
    upgrade_transfer_s: float = _t(300.0, "ctl", "`llmgw ctl upgrade` gives the upload of a release to each control plane this long, and an agent or a gateway its fetch of the release from the control plane it follows")
    ctl_poll_s: float = _t(0.2, "ctl", "`llmgw ctl` asks again this often while it waits for a change it asked for (an agent back after its restart)")
    ctl_request_s: float = _t(30.0, "ctl", "`llmgw ctl` waits this long for the admin API's answer")
    ctl_election_wait_s: float = _t(10.0, "ctl", "`llmgw ctl` asks again, every ctl_poll_s, for this long while the member it asks answers that no leader is elected (503 no_leader: nothing was forwarded; an election takes about a second)")
    mirror_commit_s: float = _t(900.0, "ctl", "`llmgw ctl mirror add` waits this long for the commit of an upload (the leader hashes and validates the whole file: about a second per GiB)")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"timeout {f.name} must be a positive number of seconds, not {value!r}")

    @property
    def stream_silence_s(self) -> float:
        """The silence after which either end of an agent's stream takes its peer for gone."""
        return SILENT_BEATS * self.stream_heartbeat_s

    @property
    def agent_reconnect(self) -> Reconnect:
        """How an agent looks for the leader."""
        return Reconnect(self.agent_reconnect_min_s, self.agent_reconnect_max_s, self.agent_election_retry_s,
                         self.stream_silence_s)

    @property
    def gateway_reconnect(self) -> Reconnect:
        """How a remote gateway looks for the leader."""
        return Reconnect(self.gateway_reconnect_min_s, self.gateway_reconnect_max_s, self.gateway_election_retry_s,
                         self.gateway_silence_s)

    def overridden(self, spec: str) -> Timeouts:
        """These timeouts with `name=seconds,name=seconds` applied (`LLMGW_TIMEOUTS`, read by the
        `control` and `agent` roles: tests of processes shorten what they wait on). Raises
        ValueError naming an unknown field or a bad value."""
        changes = overrides(spec, {f.name for f in dataclasses.fields(self)}, float, "SECONDS", "timeouts",
                            "a number of seconds")
        return dataclasses.replace(self, **changes)

    def scaled(self, factor: float) -> Timeouts:
        """Every value times `factor`: tests shorten them all at once."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name) * factor for f in dataclasses.fields(self)})

    @staticmethod
    def table() -> list[tuple[str, str, float, str]]:
        """(name, area, default, help) for each timeout, in declaration order."""
        return [(f.name, f.metadata["area"], float(getattr(TIMEOUTS, f.name)), f.metadata["help"])
                for f in dataclasses.fields(Timeouts)]


TIMEOUTS = Timeouts()
