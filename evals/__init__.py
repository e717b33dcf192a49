"""Eval suites (quality via lm-eval, toxicity, safety, over-refusal) and the gate decision. Arrives with the
eval-gate issue; nothing here yet."""
