"""The inference auction server: auction core, engines, batching and the HTTP API."""
