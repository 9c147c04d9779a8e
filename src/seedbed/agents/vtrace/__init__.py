"""V-trace (IMPALA, Espeholt et al. 2018): an actor-critic corrected for policy lag."""
