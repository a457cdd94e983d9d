"""Billing: prices, usage ledger in GPU-seconds, credits, spend limits and Stripe."""
