"""Example agents built on the connector (run them from the repository root, e.g. `python -m examples.github_agent`)."""
