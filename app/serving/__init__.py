"""Serving: the uvicorn server and its worker processes, the startup banner and checks, and the API docs' assets. Cross-cutting code stays in app.core."""
