"""Every route of the admin API in one table: method, path, who may call it, and the operation it runs.

Each line calls one operation of `control/ops/` (or, for the public probes, one answer of the API
itself); `api/route.py` does the rest alike for all (role, leader forwarding, idempotency, error
shape). The OpenAPI document (`api/openapi.py`) is held to this table by tests/unit/test_openapi.py.
A new admin route is one line here, beside its operation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from pathlib import Path

from llmgw.control.api import metrics, openapi
from llmgw.control.api.route import ADMIN, MACHINE, PUBLIC, VIEWER, Call, File, Raw, Route
from llmgw.control.ops import (gateways, guard, judges, keys, members, mirror, mirror_serve, models, nodes, notify,
                               plan, requests, settings, status, system, trust, upgrade)


async def _health(c: Call) -> dict[str, object]:
    return {"status": "ok", "leader": c.ctx.store.is_leader()}


async def _openapi(c: Call) -> Raw:
    return Raw(openapi.text(), "application/json")


async def _status(c: Call) -> Raw:
    """The summary's page the query asks for: JSON bytes kept per revision and per query (control/status_cache.py)."""
    return Raw(await status.status(c.ctx, c.authorization, c.args), "application/json")


def _chunks(c: Call) -> AsyncIterator[bytes]:
    assert c.chunks is not None
    return c.chunks


async def _file(found: Awaitable[Path]) -> File:
    return File(await found)


ROUTES: tuple[Route, ...] = (
    # Probes and tools: no key (they say what docs/api.md and the dashboards say).
    Route("GET", "/health", PUBLIC, _health),
    Route("GET", "/metrics", PUBLIC, lambda c: metrics.scrape(c.ctx)),
    Route("GET", openapi.PATH, PUBLIC, _openapi),
    # The cluster.
    Route("GET", "/api/v1/status", VIEWER, _status),
    Route("POST", "/api/v1/plan", ADMIN, lambda c: plan.plan(c.ctx, c.body), body=True),
    Route("POST", "/api/v1/system/stop", ADMIN, lambda c: system.stop(c.ctx, c.commit)),
    Route("POST", "/api/v1/system/start", ADMIN, lambda c: system.start(c.ctx, c.commit)),
    # Models.
    Route("GET", "/api/v1/models", VIEWER, lambda c: models.list_models(c.ctx)),
    Route("POST", "/api/v1/models", ADMIN, lambda c: models.serve(c.ctx, c.commit, c.body), body=True),
    Route("GET", "/api/v1/models/<path:name>", VIEWER, lambda c: models.show(c.ctx, c.path["name"])),
    Route("DELETE", "/api/v1/models/<path:name>", ADMIN, lambda c: models.remove(c.ctx, c.commit, c.path["name"])),
    Route("POST", "/api/v1/models/<path:name>/retry", ADMIN,
          lambda c: models.retry(c.ctx, c.commit, c.path["name"])),
    # Settings.
    Route("GET", "/api/v1/settings", VIEWER, lambda c: settings.list_settings(c.ctx)),
    Route("GET", "/api/v1/settings/<path:key>", VIEWER, lambda c: settings.get(c.ctx, c.path["key"])),
    Route("PUT", "/api/v1/settings/<path:key>", ADMIN,
          lambda c: settings.put(c.ctx, c.commit, c.path["key"], c.body), body=True),
    # Nodes.
    Route("GET", "/api/v1/nodes", VIEWER, lambda c: nodes.list_nodes(c.ctx)),
    Route("GET", "/api/v1/nodes/<path:name>", VIEWER, lambda c: nodes.show(c.ctx, c.path["name"])),
    Route("DELETE", "/api/v1/nodes/<path:name>", ADMIN, lambda c: nodes.forget(c.ctx, c.commit, c.path["name"])),
    Route("POST", "/api/v1/nodes/<path:name>/approve", ADMIN,
          lambda c: nodes.approve(c.ctx, c.commit, c.path["name"])),
    Route("POST", "/api/v1/nodes/<path:name>/restart", ADMIN, lambda c: nodes.restart(c.ctx, c.path["name"])),
    Route("POST", "/api/v1/nodes/<path:name>/cordon", ADMIN,
          lambda c: nodes.cordon(c.ctx, c.commit, c.path["name"], "cordon")),
    Route("POST", "/api/v1/nodes/<path:name>/drain", ADMIN,
          lambda c: nodes.cordon(c.ctx, c.commit, c.path["name"], "drain")),
    Route("POST", "/api/v1/nodes/<path:name>/uncordon", ADMIN,
          lambda c: nodes.cordon(c.ctx, c.commit, c.path["name"], "uncordon")),
    Route("POST", "/api/v1/nodes/<path:name>/upgrade", ADMIN,
          lambda c: upgrade.upgrade_node(c.ctx, c.path["name"], c.body), body=True),
    # Gateways (the leader's streams).
    Route("GET", "/api/v1/gateways", VIEWER, lambda c: gateways.list_gateways(c.ctx)),
    Route("POST", "/api/v1/gateways/<path:name>/restart", ADMIN, lambda c: gateways.restart(c.ctx, c.path["name"])),
    Route("POST", "/api/v1/gateways/<path:name>/upgrade", ADMIN,
          lambda c: gateways.upgrade(c.ctx, c.path["name"], c.body), body=True),
    # The request log (fanned out to the gateways) and usage.
    Route("GET", "/api/v1/requests", VIEWER, lambda c: requests.list_page(c.ctx, c.args, c.authorization)),
    Route("GET", "/api/v1/requests/<path:request_id>", VIEWER,
          lambda c: requests.one(c.ctx, c.path["request_id"], c.authorization)),
    Route("GET", "/api/v1/usage", VIEWER, lambda c: requests.usage_rollups(c.ctx, c.args)),
    # API keys.
    Route("GET", "/api/v1/keys", VIEWER, lambda c: keys.list_keys(c.ctx)),
    Route("POST", "/api/v1/keys", ADMIN, lambda c: keys.create(c.ctx, c.commit, c.body), body=True),
    Route("DELETE", "/api/v1/keys/<path:key_id>", ADMIN, lambda c: keys.revoke(c.ctx, c.commit, c.path["key_id"])),
    # Guardrails: policies and judges.
    Route("GET", "/api/v1/guard/policies", VIEWER, lambda c: guard.list_policies(c.ctx)),
    Route("GET", "/api/v1/guard/policies/<path:name>", VIEWER, lambda c: guard.show(c.ctx, c.path["name"])),
    Route("PUT", "/api/v1/guard/policies/<path:name>", ADMIN,
          lambda c: guard.put(c.ctx, c.commit, c.path["name"], c.body), body=True),
    Route("DELETE", "/api/v1/guard/policies/<path:name>", ADMIN,
          lambda c: guard.remove(c.ctx, c.commit, c.path["name"])),
    Route("GET", "/api/v1/guard/judges", VIEWER, lambda c: judges.list_judges(c.ctx)),
    Route("POST", "/api/v1/guard/judges/enable", ADMIN, lambda c: judges.enable(c.ctx, c.commit, c.body), body=True),
    # Nothing of the text is logged or kept.
    Route("POST", "/api/v1/guard/judges/ask", ADMIN, lambda c: judges.ask(c.ctx, c.body), body=True),
    # Trust between machines: join tokens, joins (the token is the credential), certificates, the CA.
    Route("GET", "/api/v1/trust/tokens", VIEWER, lambda c: trust.list_tokens(c.ctx)),
    Route("POST", "/api/v1/trust/tokens", ADMIN, lambda c: trust.create_token(c.ctx, c.commit, c.body), body=True),
    Route("DELETE", "/api/v1/trust/tokens/<token_id>", ADMIN,
          lambda c: trust.remove_token(c.ctx, c.commit, c.path["token_id"])),
    Route("POST", "/api/v1/trust/join", PUBLIC, lambda c: trust.join(c.ctx, c.body), body=True),
    Route("GET", "/api/v1/trust/machines", VIEWER, lambda c: trust.list_machines(c.ctx)),
    Route("POST", "/api/v1/trust/machines/<role>/<name>/revoke", ADMIN,
          lambda c: trust.revoke(c.ctx, c.commit, c.path["role"], c.path["name"])),
    Route("GET", "/api/v1/trust/ca", PUBLIC, lambda c: trust.ca_show(c.ctx)),
    Route("POST", "/api/v1/trust/ca/rotate", ADMIN, lambda c: trust.ca_rotate(c.ctx), local=True),
    # Webhooks: the leader's notifier.
    Route("GET", "/api/v1/notify/status", VIEWER, lambda c: notify.status(c.ctx)),
    Route("POST", "/api/v1/notify/test", ADMIN, lambda c: notify.test(c.ctx)),
    # The control planes: the table and this member's view are answered by the member asked, from its
    # own view (so it also answers while there is no leader).
    Route("GET", "/api/v1/cluster/members", VIEWER, lambda c: members.table(c.ctx, c.authorization), local=True),
    Route("GET", "/api/v1/cluster/self", VIEWER, lambda c: members.self_view(c.ctx), local=True),
    Route("POST", "/api/v1/cluster/self/restart", ADMIN, lambda c: members.restart_self(c.ctx), local=True),
    Route("POST", "/api/v1/cluster/self/upgrade", ADMIN, lambda c: upgrade.upgrade_self(c.ctx, c.body), body=True,
          local=True),
    # Release files (`ctl upgrade`): uploaded to each member, fetched by the machines that follow it, by sha256.
    Route("PUT", "/api/v1/releases/<sha256>", ADMIN, lambda c: upgrade.upload(c.ctx, c.path["sha256"], _chunks(c)),
          local=True, stream=True),
    Route("GET", "/api/v1/releases/<sha256>", MACHINE, lambda c: _file(upgrade.download(c.ctx, c.path["sha256"])),
          local=True),
    # The model mirror (docs/mirror.md): its catalog, resumable uploads (to the leader), blobs between control planes.
    Route("GET", "/api/v1/mirror", VIEWER, lambda c: mirror.list_files(c.ctx, c.authorization)),
    Route("GET", "/api/v1/mirror/held", VIEWER, lambda c: mirror.held(c.ctx), local=True),
    Route("POST", "/api/v1/mirror/uploads", ADMIN, lambda c: mirror.start_upload(c.ctx, c.body), body=True),
    Route("GET", "/api/v1/mirror/uploads/<upload_id>", VIEWER,
          lambda c: mirror.upload_status(c.ctx, c.path["upload_id"])),
    Route("PUT", "/api/v1/mirror/uploads/<upload_id>", ADMIN,
          lambda c: mirror.put_piece(c.ctx, c.path["upload_id"], c.headers, _chunks(c)), stream=True),
    Route("DELETE", "/api/v1/mirror/uploads/<upload_id>", ADMIN,
          lambda c: mirror.drop_upload(c.ctx, c.path["upload_id"])),
    Route("POST", "/api/v1/mirror/uploads/<upload_id>/commit", ADMIN,
          lambda c: mirror.commit_upload(c.ctx, c.commit, c.path["upload_id"])),
    Route("GET", "/api/v1/mirror/<name>", VIEWER, lambda c: mirror.show(c.ctx, c.path["name"], c.authorization)),
    Route("DELETE", "/api/v1/mirror/<name>", ADMIN, lambda c: mirror.remove(c.ctx, c.commit, c.path["name"])),
    Route("POST", "/api/v1/mirror/<name>/serve", ADMIN,
          lambda c: mirror_serve.serve(c.ctx, c.commit, c.path["name"], c.body), body=True),
    Route("POST", "/api/v1/mirror/<name>/pin", ADMIN,
          lambda c: mirror.pin(c.ctx, c.commit, c.path["name"], c.body), body=True),
    Route("POST", "/api/v1/cluster/members", ADMIN, lambda c: members.add(c.ctx, c.note, c.body), body=True),
    Route("DELETE", "/api/v1/cluster/members/<path:member>", ADMIN,
          lambda c: members.remove(c.ctx, c.note, c.path["member"])),
)
