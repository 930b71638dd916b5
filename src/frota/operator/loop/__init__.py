"""The loop that acts: kopf's handlers (thin), each InferenceService's reconcile loop
(converge), one reconcile (fetch -> desired -> apply -> status), rollouts, the
operator's memory between handler calls (state) and its Kubernetes client (apply)."""
