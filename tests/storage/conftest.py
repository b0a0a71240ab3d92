"""One moto S3 server per test module (a restart test starts its own; a module may put another server in
its place by a `s3_server` fixture of its own), with the client's environment set."""

from __future__ import annotations

import pytest

from tests.support.s3 import S3Server


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    pytest.importorskip("moto.server", reason="moto[server] is needed for the object-storage tests")
    pytest.importorskip("boto3", reason="boto3 is needed for the object-storage tests")
    pytest.importorskip("botocore", reason="the s3 extra (botocore) is needed for the object-storage tests")
    with S3Server(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def s3(s3_server, monkeypatch):
    """The module's server, with AWS_* and AWS_ENDPOINT_URL pointing at it for this test."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    return s3_server
