"""Request-log analysis and the decisions built on it: canary and shadow analysis (``canary``), the rollout
state machine (``rollout``), the rollout controller that acts on them (``controller``); drift arrives with the
retraining issue."""
