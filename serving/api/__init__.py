"""HTTP: the FastAPI app factory, its routers, the reading of request bodies and the outermost middleware."""
