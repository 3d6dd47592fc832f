"""The publisher's commands of the `changefeed` CLI.

    commands.py  serve, publish, stats
    trace.py     `changefeed trace CURSOR`
    seen.py      `changefeed publish --wait-seen-by`
"""
