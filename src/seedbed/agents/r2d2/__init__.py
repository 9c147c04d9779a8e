"""R2D2: recurrent Q-learning from prioritized sequence replay, with burn-in."""
