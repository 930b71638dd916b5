"""The Kubernetes operator: one InferenceService in, its fleet's objects and status out.

`loop` acts (kopf's handlers, each fleet's reconcile loop, rollouts, the state between
calls); `builders` render the child objects from the plan (pure); `reports` turn what
the cluster and the workers show into status; `scaling` sets the replicas. `cli` and
`render_cli` are the `frota operator` and `frota render` commands (docs/internals.md
draws the whole layout)."""
