"""The OpenAI wire format (requests, responses, stream chunks, the OpenAPI description) and its errors."""
