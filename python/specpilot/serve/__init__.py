"""`specpilot serve`: an OpenAI-compatible HTTP server on the batched engine (BatchEngine in its own thread)."""
from .server import BackgroundServer, make_served

__all__ = ["BackgroundServer", "make_served"]
