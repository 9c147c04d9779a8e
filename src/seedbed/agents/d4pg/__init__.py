"""D4PG: a deterministic policy and a distributional critic learned from n-step replay."""
