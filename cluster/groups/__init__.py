"""Consumer groups: the sans-IO group coordinator and its __consumer_offsets records."""
