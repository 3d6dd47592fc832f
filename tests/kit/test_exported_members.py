import changefeed_testing
import changefeed_testing.conformance


def test_exported_members() -> None:
    assert changefeed_testing.__all__ == sorted(changefeed_testing.__all__, key=str)
    assert set(changefeed_testing.__all__) == {
        "Faults",
        "PublisherProcess",
        "RedisServer",
        "RunningPublisher",
        "SlowSocket",
        "eventually",
        "free_port",
        "scaled",
        "write_config",
    }
    assert changefeed_testing.conformance.__all__ == sorted(changefeed_testing.conformance.__all__)
    assert set(changefeed_testing.conformance.__all__) == {
        "Outcome",
        "Report",
        "Status",
        "Target",
        "checks",
        "run_checks",
    }
    for module in (changefeed_testing, changefeed_testing.conformance):
        for name in module.__all__:
            assert getattr(module, name).__module__.startswith("changefeed_testing.")
