"""TF_CONFIG clusters (placeholder until the cluster module lands)."""
