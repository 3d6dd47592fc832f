"""The public surface of publisher.spark, pinned."""

import publisher.spark


def test_exported_members() -> None:
    assert publisher.spark.__all__ == [
        "CREATED",
        "DELETED",
        "ChangefeedDataSource",
        "CommittedBatch",
        "DiffCounts",
        "Figures",
        "OptionError",
        "committed_batches",
        "publish_dataset_changes",
        "register",
    ]
    assert all(hasattr(publisher.spark, name) for name in publisher.spark.__all__)
