"""How many replicas a fleet runs: the autoscaler's decisions (pure, `decisions`), the
autoscaling timer's reads and writes around them (`autoscaler`), and the demand
ConfigMap that brings a fleet at zero back at once (`demand`)."""
