"""The production chat endpoint: OpenAI API over BentoML + vLLM (the only package importing BentoML).

Layers, each importing only those below it (the ``serving-layers`` contract in pyproject.toml):

    service | launcher     the BentoML service, and starting ``bentoml serve`` for ``lifecycle serve``
    api                    the FastAPI app and its routers, request reading, the HTTP middleware
    runtime                engines, router, store and gateway built from a ``ServeSpec``, kept healthy
    pipeline               the request pipeline: gateway, call, context budget, shadow, recorder, limits, metrics
    engines | safety | state   vLLM engines and routing; pre- and post-filters; the serving database
    wire                   the OpenAI wire format and the OpenAI-shaped errors
    config                 the ``serving:`` section of the root config
"""
