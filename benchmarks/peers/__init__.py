"""Peers measured side by side with dhisparse in the same run (thin adapters, one per engine)."""
