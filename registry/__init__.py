"""MLflow runs, registered versions, aliases, lineage and gate records (the only package importing MLflow).
Arrives with the training/registry issue; nothing here yet."""
