"""The mirror's decisions, sans-IO (docs/architecture.md, "The mirror: a sans-IO core").

Nothing here opens a socket, sleeps or reads a clock: each module takes what the clusters
answered and says what to do next, and the trio shells beside it (`mirror/worker.py`,
`mirror/mirror_topics.py`, `mirror/failover.py`) ask and do. The simulation
(`tests/mirror_sim.py`) drives the same code over simulated clusters, links and operators.

- `disaster_recovery`: promote, failover and failback of a mirror-topics flow, each a
  generator of requests (`Step`) that a shell answers; the failover ledger; the RPO.
- `topic_copy`: a mirror-topics partition copy: where a claim resumes, which fetched chunk
  may be appended, what a topic pair is (copied, refused, reversed, its source deleted).
"""
