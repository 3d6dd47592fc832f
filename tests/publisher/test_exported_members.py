import publisher


def test_exported_members() -> None:
    exported = set(publisher.__all__)
    assert publisher.__all__ == sorted(publisher.__all__, key=str)
    assert exported == {
        "Backoff",
        "BucketUnavailable",
        "Change",
        "ChangeBucket",
        "ChangeError",
        "ChangeItem",
        "ChangeKind",
        "ChangefeedError",
        "CommitOutcomeUnknown",
        "CloseCode",
        "Config",
        "ConfigError",
        "Cursor",
        "CursorError",
        "PartitionMismatch",
        "ProtocolError",
        "Registration",
        "RegistrationError",
    "ReplicationTimeout",
        "Resource",
        "Service",
        "Watch",
        "connect",
        "load_config",
        "parse_config",
    }
    for name in exported:
        assert getattr(publisher, name).__module__.startswith(("publisher.", "changefeed."))
