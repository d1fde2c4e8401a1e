"""A real S3 API on loopback (moto's server) holding a bucket of objects, for the tests
that read data by URL: the token shards, and bundled market jobs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def s3_bucket(bucket: str, objects: dict[str, bytes]) -> Iterator[dict]:
    """Serve `objects` (key -> bytes) in `bucket`; yields the fsspec storage options
    that reach it (`endpoint_url`, its test credentials, the region)."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {"endpoint_url": f"http://{host}:{port}", "key": "test", "secret": "test",
                   "client_kwargs": {"region_name": "us-east-1"}}
        client = boto3.client("s3", endpoint_url=options["endpoint_url"],
                              region_name="us-east-1", aws_access_key_id="test",
                              aws_secret_access_key="test")
        client.create_bucket(Bucket=bucket)
        for key, body in objects.items():
            client.put_object(Bucket=bucket, Key=key, Body=body)
        yield options
    finally:
        server.stop()


def aws_env(options: dict) -> dict[str, str]:
    """The environment that points boto (and so s3fs) at the server of `options`."""
    return {"AWS_ENDPOINT_URL": options["endpoint_url"], "AWS_ACCESS_KEY_ID": options["key"],
            "AWS_SECRET_ACCESS_KEY": options["secret"], "AWS_DEFAULT_REGION": "us-east-1"}
