"""Topology file (to come): TOML schema, validation, plan/apply against running clusters."""
