"""Request-log analysis and the decisions built on it: canary and shadow analysis (``canary``), the rollout
state machine (``rollout``), the rollout controller that acts on them (``controller``), prompt drift against the
champion's training data (``drift``) and the retrain decision it feeds (``retrain``)."""
