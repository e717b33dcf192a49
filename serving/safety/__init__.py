"""The gateway's safety filters: the pre-filter on prompts, the post-filter on replies, and their verdict."""
