"""Mirror workers (to come): source consumer groups, exactly-once producers into the aggregate cluster."""
