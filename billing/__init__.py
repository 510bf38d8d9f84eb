"""The SQL ledger of budgets, holds and charges."""
