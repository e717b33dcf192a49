"""The distributed fine-tune: the launcher, the rank's worker, its objectives and collectives."""
