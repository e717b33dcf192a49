"""The gateway's persistent state: the tables, and the store over keys, conversations, usage, logs and ratings."""
