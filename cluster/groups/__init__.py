"""Consumer groups: the sans-IO group coordinator, its state and `__consumer_offsets`
records, and its trio shell (ownership, persistence, timers)."""
