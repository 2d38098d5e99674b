"""The web layer: browser pages (connect, callback), health endpoints. It calls the domain, never the reverse."""
