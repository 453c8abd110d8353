"""The costs REST API: ledger aggregates and the price catalog."""
