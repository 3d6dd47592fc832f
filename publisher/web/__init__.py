"""The HTTP face of the publisher: aiohttp handlers, the middleware, metrics and health.

Handlers find what they share through the `web.AppKey`s of `app_keys.py`.
"""
