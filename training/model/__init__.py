"""The model side: tokenizer, bootstrap pretraining, model folders, the learning-rate schedule."""
