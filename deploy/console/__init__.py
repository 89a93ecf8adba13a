"""The web console: one application for a whole topology (`dcmirror console --config FILE`).

A thin reader over public protocols, in Redpanda Console's shape: the clusters over the Kafka
protocol, the mirror workers over their admin HTTP, the warehouse through its service. Each
page is a route with a template; what a page shows is decided in views.py (sans-IO), what is
asked and when in poller.py (trio), how people log in and what they may do in auth.py.
"""
