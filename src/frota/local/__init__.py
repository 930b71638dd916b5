"""`frota up` and `frota status`: an InferenceService run as local processes, no cluster.

topology (manifest -> planner -> LocalTopology) -> fleet (ports, rank env,
argv) -> supervisor (start, probe, restart, stop) -> progress/state for the
user and `frota status`. Nothing here imports torch: the workers do.
"""
