"""Failed requests told a few times in full per kind, then counted: at a low rate and when the mount ends."""

from __future__ import annotations

from prep.mount.failures import COUNTS_EVERY_SECONDS, FULL_PER_KIND, FailedRequests


def test_each_kind_of_failure_is_told_in_full_a_few_times_then_counted_at_a_low_rate_and_at_the_end():
    said: list[str] = []
    now = [0.0]
    failures = FailedRequests(said.append, clock=lambda: now[0])
    asked: list[str] = []

    def what() -> str:
        asked.append("/s0_000.txt")
        return "/s0_000.txt"

    def fail(request: str, error: Exception) -> None:
        try:
            raise error
        except Exception as raised:  # noqa: BLE001 - raised, so it has a traceback to point at
            failures.failed(request, what, raised)

    for _ in range(FULL_PER_KIND + 2):
        fail("READ", IsADirectoryError(21, "Is a directory"))
    fail("LOOKUP", RuntimeError("index gone"))
    assert len(said) == FULL_PER_KIND + 1 and len(asked) == len(said), said  # counted ones not described
    assert said[0].startswith("READ of /s0_000.txt answered as an I/O error: IsADirectoryError: [Errno 21]")
    assert "raised at" in said[0] and __file__ in said[0]
    assert said[FULL_PER_KIND - 1].endswith("Further ones like it are counted.")
    assert said[-1].startswith("LOOKUP of /s0_000.txt answered as an I/O error: RuntimeError: index gone")
    now[0] = COUNTS_EVERY_SECONDS
    fail("READ", IsADirectoryError(21, "Is a directory"))
    assert said[-1] == "3 more READ requests failed with IsADirectoryError."
    failures.close()
    assert said[-1] == "3 more READ requests failed with IsADirectoryError.", "nothing new to tell at the end"
    fail("READ", IsADirectoryError(21, "Is a directory"))
    failures.close()
    assert said[-1] == "1 more READ request failed with IsADirectoryError."
