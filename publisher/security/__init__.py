"""Who is asking and from where: identities, origins, client addresses, rate limits, TLS.

    auth.py        bearer tokens and client certificates to identities with scopes
    origin.py      browser origins and hosts: which cross-site requests are refused
    clientaddr.py  the client's address (the peer's, or a trusted proxy's X-Forwarded-For)
    ratelimit.py   token buckets per client address
    tls.py         the server's `ssl.SSLContext`
"""
