"""`changefeed conformance URL`: the RFD 5 protocol checks, run against any publisher.

Each check is a small coroutine against a `Target` (target.py) that passes, fails with a reason,
or says why it could not run: discovery and registration (registration.py), change items
(items.py), resuming (resume.py). run.py runs them, report.py prints the report, cli.py is the
command. docs/testing.md lists the checks.
"""

from changefeed_testing.conformance.outcome import Outcome, Status
from changefeed_testing.conformance.run import Report, checks, run_checks
from changefeed_testing.conformance.target import Target

__all__ = ["Outcome", "Report", "Status", "Target", "checks", "run_checks"]
