"""What the operator reports about a fleet: its status (conditions, replicas, capacity,
adapters, model cache) from the children the watches show, and the timers' reads of what
the workers and the model-cache Job say (KV cache, loaded adapters, download progress).

The status half is pure; the reading half keeps what it reads in the operator state,
and the reconcile loop writes it."""
