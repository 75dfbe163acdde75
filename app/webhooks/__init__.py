"""Webhooks: a tenant's subscriptions to its events, signed deliveries, blocking hooks."""
