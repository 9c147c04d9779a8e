"""DQN: double, dueling, n-step Q-learning from prioritized replay (no recurrence)."""
