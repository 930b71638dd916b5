"""Frota: LLM inference fleets on Kubernetes.

The control plane (`frota.api`, `frota.operator`, `frota.local`, `frota.cli`)
never imports torch; the data plane (`frota.engine`, `frota.server`,
`frota.router`) is what the worker image runs. `frota.api.contract` holds the
facts all of them share.
"""
