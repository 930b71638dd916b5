"""The pure planner: an InferenceService spec -> the Topology both control planes run.

Roles, replica groups, ranks, each role's memory budget, model shapes, semantic
validation and one launch builder per runtime. It imports `frota.api` alone (no
kopf, torch or aiohttp): the operator renders the Topology into child objects,
`frota up` into local processes.
"""
