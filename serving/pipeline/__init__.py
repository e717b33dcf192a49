"""The request pipeline, independent of the web framework: gateway, call, context budget, shadow, recorder."""
