"""The running service: the aiohttp application and its life, workers, systemd's notify.

    service.py    `Service`: the routes, the tail, the trimmer and the background tasks
    lifecycle.py  signals, reloads, draining
    workers.py    `changefeed serve --workers N`
    sdnotify.py   systemd's notify protocol
"""
