"""Notification: the leader posts each failure (a `llmgw.domain.conditions.Condition`) to the webhooks in
`notify.webhooks` when it starts and when it resolves; docs/observability.md has the payloads.
"""
