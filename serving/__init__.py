"""The production chat endpoint: OpenAI API over BentoML + vLLM (the only package importing BentoML).
Arrives with the serving issue; nothing here yet."""
