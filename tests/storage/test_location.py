"""How an object store's failures are told apart (``storage.location.explain``), on the texts deltalake and pyarrow
give; the real failures are in test_stall.py (a silent store) and test_full_disk.py (a full one)."""

from __future__ import annotations

from trajstore.storage.location import explain, locate

DELTA_500 = """Generic S3 error
  ↳ Error performing PUT http://127.0.0.1:9/b/full/steps/_delta_log/00000000000000000024.json in 113ms, after 1 retries
   ↳ Server returned non-2xx status code
    ↳ 500 Internal Server Error
     ↳ <?xml version="1.0" encoding="UTF-8"?>
<Error><Code>InternalError</Code><Message>We encountered an internal error, please try again.</Message></Error>"""
DELTA_NO_ANSWER = """Generic S3 error
  ↳ Error performing PUT http://127.0.0.1:9/b/full/steps/_delta_log/00000000000000000024.json in 2.1ms, after 1 retries
   ↳ HTTP error: error sending request"""


def test_a_log_commit_the_store_refused_is_its_failure_not_an_unreachable_store() -> None:
    """deltalake retries a failed PUT of a log entry and says "after 1 retries" whether the server answered 500
    (its disk full: seen when a compaction's commit met the full disk) or never answered."""
    location = locate("s3://b/full/steps", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true"})
    refused = str(explain(OSError(DELTA_500), location))
    assert "failed on its side (PUT 00000000000000000024.json: InternalError: We encountered an internal error" \
        in refused and "its disk may be full" in refused
    assert "cannot reach http://127.0.0.1:9" in str(explain(OSError(DELTA_NO_ANSWER), location))
