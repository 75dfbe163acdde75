"""Accounting: tokens, the model catalog, the budget and its verdicts, the ledger of running totals, relief, provider usage and overflow errors."""
