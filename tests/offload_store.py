"""Object store APIs served over HTTP for offload tests: moto's standalone server (S3) and
Azurite (Azure Blob), each a child process on a free port.

``running_moto_s3`` starts ``python -m moto.server`` on a free port with request
authentication on (moto checks signatures and access keys once its first
``UNAUTHENTICATED_SETUP_ACTIONS`` requests are spent): those requests create an IAM user, its
access key and an allow-all policy; the bucket is then created with that key. Tests point the
offloader at ``endpoint`` with the key in the standard AWS environment variables, as a user
points it at S3 or MinIO. Teardown stops the server by its process id.

``running_azurite`` starts Azurite's blob service (Microsoft's Azure Storage emulator, installed
by ``make check-azurite`` with npm under ``.venv/azurite``; ``AZURITE_BLOB`` names another
binary) in memory, with one account whose key is made for the run (``AZURITE_ACCOUNTS``), and
makes the container with the Azure SDK. The offloader reaches it as a user reaches Azure: the
account and key in Pulsar's ``AZURE_STORAGE_ACCOUNT`` / ``AZURE_STORAGE_ACCESS_KEY``, the
account's URL as the endpoint.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from broker.offload import OffloadSettings
from consumers.launcher import free_port, stop_process

UNAUTHENTICATED_SETUP_ACTIONS = 3
"""create_user, create_access_key, put_user_policy: then every request must be signed."""
START_WAIT_S = 30.0
REGION = "us-east-1"


@dataclass
class MotoS3:
    endpoint: str
    bucket: str
    access_key_id: str
    secret_access_key: str
    proc: subprocess.Popen[bytes]

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=self.access_key_id,
                            aws_secret_access_key=self.secret_access_key)

    def settings(self, **overrides: Any) -> OffloadSettings:
        fields: dict[str, Any] = {"driver": "s3", "bucket": self.bucket, "region": REGION,
                                  "service_endpoint": self.endpoint, "max_block_size_bytes": 4096,
                                  "read_buffer_size_bytes": 16384, "max_retries": 1, "retry_timeout_ms": 3000,
                                  "request_timeout_ms": 5000, "connect_timeout_ms": 1000}
        return OffloadSettings(**{**fields, **overrides})

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key_id, "AWS_SECRET_ACCESS_KEY": self.secret_access_key}

    def stop(self) -> None:
        if self.proc.poll() is None:
            stop_process(self.proc)

    def keys(self) -> list[str]:
        listed = self.client().list_objects_v2(Bucket=self.bucket)
        return sorted(obj["Key"] for obj in listed.get("Contents", []))


def _wait_listening(port: int, proc: subprocess.Popen[bytes], name: str = "moto server") -> None:
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{name} did not listen on {port} within {START_WAIT_S} s")


def _setup(endpoint: str, bucket: str) -> tuple[str, str]:
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="setup",
                       aws_secret_access_key="setup")
    iam.create_user(UserName="offloader")
    key = iam.create_access_key(UserName="offloader")["AccessKey"]
    iam.put_user_policy(UserName="offloader", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=key["AccessKeyId"],
                 aws_secret_access_key=key["SecretAccessKey"]).create_bucket(Bucket=bucket)
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


@contextmanager
def running_moto_s3(bucket: str = "offload-bucket") -> Iterator[MotoS3]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["INITIAL_NO_AUTH_ACTION_COUNT"] = str(UNAUTHENTICATED_SETUP_ACTIONS)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc)
        endpoint = f"http://127.0.0.1:{port}"
        key_id, secret = _setup(endpoint, bucket)
        server = MotoS3(endpoint, bucket, key_id, secret, proc)
        yield server
    finally:
        if proc.poll() is None:
            stop_process(proc)


AZURITE_INSTALL = Path(__file__).resolve().parent.parent / ".venv/azurite/node_modules/.bin/azurite-blob"


@dataclass
class Azurite:
    account: str
    key: str
    container: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/{self.account}"

    def env(self) -> dict[str, str]:
        return {"AZURE_STORAGE_ACCOUNT": self.account, "AZURE_STORAGE_ACCESS_KEY": self.key}

    def settings(self, **overrides: Any) -> OffloadSettings:
        fields: dict[str, Any] = {"driver": "azureblob", "bucket": self.container, "service_endpoint": self.endpoint,
                                  "max_block_size_bytes": 4096, "read_buffer_size_bytes": 16384, "max_retries": 1,
                                  "retry_timeout_ms": 3000, "request_timeout_ms": 5000, "connect_timeout_ms": 1000}
        return OffloadSettings(**{**fields, **overrides})

    def container_client(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        service = BlobServiceClient(self.endpoint, credential={"account_name": self.account, "account_key": self.key})
        return service.get_container_client(self.container)

    def names(self) -> list[str]:
        return sorted(blob.name for blob in self.container_client().list_blobs())


def azurite_binary() -> str:
    binary = os.environ.get("AZURITE_BLOB") or str(AZURITE_INSTALL)
    if not Path(binary).exists():
        raise RuntimeError(f"the azureblob offload tests need Azurite's blob service at {binary}: run 'make "
                           "check-azurite' (npm install azurite; Debian's nodejs and npm packages)")
    return binary


@contextmanager
def running_azurite(container: str = "offload-container") -> Iterator[Azurite]:
    port = free_port()
    account, key = "magnetartest", base64.b64encode(secrets.token_bytes(64)).decode()
    env = {**os.environ, "AZURITE_ACCOUNTS": f"{account}:{key}"}
    proc = subprocess.Popen([azurite_binary(), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                             "--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--silent"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc, "Azurite")
        server = Azurite(account, key, container, port, proc)
        server.container_client().create_container()
        yield server
    finally:
        if proc.poll() is None:
            stop_process(proc)
