"""PPO: clipped-surrogate policy optimisation on central inference (APPO with V-trace)."""
