"""Training stage: the project's own chat data, content-addressed snapshots, the offline tokenizer and
base-model bootstrap (and, later, DeepSpeed fine-tuning). Plain Python: no Prefect, no MLflow."""
