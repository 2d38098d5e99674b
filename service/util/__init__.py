"""Small helpers that are not the domain: the standard library only, and nothing of the connector.

- `bounded`: a dict that keeps at most so many keys (the oldest set go first)
- `clock`: the time a connector reads, movable by tests
- `cookies`: a cookie jar that keeps nothing, for shared outbound HTTP clients
- `heap`: what a long-running process built to start, out of the garbage collector's view (`gc.freeze`)
- `hosts`: whether a host name could mislead a person (IDN, mixed scripts)
- `locks`: one asyncio lock per key, existing only while in use
- `periodic`: a background loop that backs off on errors
"""
