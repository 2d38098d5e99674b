"""Small helpers that are not the domain: the standard library only, and nothing of the connector.

- `clock`: the time a connector reads, movable by tests
- `cookies`: a cookie jar that keeps nothing, for shared outbound HTTP clients
- `hosts`: whether a host name could mislead a person (IDN, mixed scripts)
- `locks`: one asyncio lock per key, existing only while in use
- `periodic`: a background loop that backs off on errors
"""
