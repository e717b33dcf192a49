"""Request-log analysis, drift (Evidently), canary analysis, rollback and retrain decisions.
Arrives with the rollout and drift issues; nothing here yet."""
