"""Moving batches of arrays between actors and the learner: one interface, several backends."""
