"""`changefeed trace`'s pure parts: the addresses it asks and the report it prints (the command
itself runs against real publishers in test_trace_route.py)."""

from __future__ import annotations

from changefeed.cursor import Position, StreamId
from publisher.cli.trace import Answer, Gathered, advertised, committed_at, peer_address, render


def test_a_wildcard_host_is_replaced_by_the_host_asked() -> None:
    assert peer_address("http://10.0.0.5:8080/", "http://lb:80") == "http://10.0.0.5:8080"
    assert peer_address("http://0.0.0.0:8080", "https://vm.example:443") == "http://vm.example:8080"
    assert peer_address("https://[::]:8443", "http://[fd00::1]:80") == "https://[fd00::1]:8443"
    stats = {"publishers": [{"publisher": "a", "url": "http://0.0.0.0:1"},
                            {"publisher": "b", "url": ""}, {"url": "http://x:2"}]}
    assert advertised(stats, "http://h:9") == {"a": "http://h:1", "b": ""}


def test_the_report_shows_each_publisher_and_the_total() -> None:
    cursor = Position.decode("abcdefghij.0192f3a4b5c6a3")
    traced = {"publisher": "p1", "readAt": "2024-10-27T03:33:20.460Z", "readMs": 1.5,
              "listeners": 3, "services": {
                  "napi": {"listeners": 1, "firstWriteMs": 1.7, "lastWriteMs": 1.7},
                  "tcns": {"listeners": 2, "firstWriteMs": 1.7, "lastWriteMs": 250.0}}}
    gathered = Gathered(
        {"p1": Answer("http://a:1", 200, traced),
         "p2": Answer("http://b:1", 404, {"code": "NotTraced", "message": "not traced: older"})},
        {"p3": "no answer from it at http://c:1"},
    )
    lines = render(cursor, gathered)
    assert lines[1].startswith("committed  2024-11-03T20:08:30.918Z")
    text = "\n".join(lines)
    assert "publisher p1 (http://a:1)\n  read       2024-10-27T03:33:20.460Z  (+1.5 ms)" in text
    assert "  tcns     2          +1.7 ms      +250.0 ms" in text
    assert "publisher p2 (http://b:1)\n  NotTraced: not traced: older" in text
    assert "publisher p3: not reached (no answer from it at http://c:1)" in text
    assert lines[-1] == "written to 3 listener(s) by 1 of 3 publisher(s)"


def test_a_cursor_outside_the_log_has_no_commit_time() -> None:
    now = 1_732_000_000.0
    head = Position.decode("abcdefghij.0192f3a4b5c6a3")
    fresh = Position.decode(Position.single(head.epoch, StreamId(0, 0)).encode())
    future = Position.single(head.epoch, StreamId(int(now * 1000) * 3000, 0))
    not_read = Gathered({"p1": Answer("http://a:1", 404, {"code": "NotReadYet"})})
    for cursor, gathered in [
        (fresh, Gathered({"p1": Answer("http://a:1", 404, {"code": "NotTraced"})})),
        (future, not_read),
        (head, Gathered({"p1": Answer("http://a:1", 404, {"code": "NoSuchChange"}),
                         "p2": Answer("http://b:1", 404, {"code": "OtherEpoch"})})),
    ]:
        assert committed_at(cursor, gathered, now) is None
        assert render(cursor, gathered, now)[1] == (
            "committed  not in the log (no change of the log has this cursor)")
    # In the log, or it may be: the cursor's time.
    assert committed_at(head, not_read, now) == "2024-11-03T20:08:30.918Z"
    older = Gathered({"p1": Answer("http://a:1", 404, {"code": "NotTraced"})})
    assert render(head, older, now)[1].startswith("committed  2024-11-03T20:08:30.918Z")
