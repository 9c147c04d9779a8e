"""Central inference: batch requests, keep per-env state, call the agent, build unrolls."""
