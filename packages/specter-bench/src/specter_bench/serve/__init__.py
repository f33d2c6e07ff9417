"""``specter serve``: an OpenAI-compatible HTTP server over one loaded engine."""
