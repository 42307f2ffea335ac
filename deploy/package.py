"""package: a model directory -> model.tar.gz in S3.

SageMaker unpacks the archive into /opt/ml/model, so the directory's files go at the
archive's root (model.pt2, not build/model/model.pt2). The archive is byte-for-byte
reproducible (sorted names, zeroed times and owners), and its S3 key carries its
hash: packaging the same model twice uploads nothing the second time.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import sys
import tarfile
import tempfile
from pathlib import Path

from botocore.exceptions import ClientError

from deploy.aws import Aws, DeployError, error_code, say

# Build leftovers that have no business in /opt/ml/model.
_SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".git"}


def build_archive(model_dir: Path, destination: Path) -> str:
    """Write model_dir's tree as a gzipped tar to destination; returns its sha256 hex."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise DeployError(f"model directory {model_dir} does not exist (run `make model` for the example)")
    files = sorted(_walk(model_dir))
    if not files:
        raise DeployError(f"model directory {model_dir} is empty")

    with open(destination, "wb") as raw:
        # mtime=0 and no file name in the gzip header keep the bytes reproducible.
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped:
            # dereference: a symlinked file (a model linked in from a cache) is stored as
            # the file it points at; a link would dangle in /opt/ml/model.
            with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT, dereference=True) as archive:
                for relative in files:
                    path = model_dir / relative
                    if not path.exists():
                        raise DeployError(f"{path} is a broken symlink; fix or remove it before packaging")
                    info = archive.gettarinfo(str(path), arcname=relative)
                    info.mtime = 0
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    # World-readable: the container's user need not be the one who built it.
                    info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
                    if info.isfile():
                        with open(path, "rb") as handle:
                            archive.addfile(info, handle)
                    else:
                        archive.addfile(info)
    digest = hashlib.sha256()
    with open(destination, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _walk(root: Path):
    for directory, subdirs, names in os.walk(root, followlinks=True):
        subdirs[:] = sorted(d for d in subdirs if d not in _SKIP_DIRS)
        relative_dir = Path(directory).relative_to(root)
        for name in names:
            if name.endswith(".pyc"):
                continue
            yield (relative_dir / name).as_posix()


def default_bucket(aws: Aws) -> str:
    # The SageMaker Python SDK's default bucket, so users find their artifacts where they expect.
    return f"sagemaker-{aws.region}-{aws.account}"


def ensure_bucket(aws: Aws, bucket: str, create: bool) -> None:
    s3 = aws.client("s3")
    try:
        s3.head_bucket(Bucket=bucket)
        return
    except ClientError as error:
        code = error_code(error)
        if code in ("403", "AccessDenied"):
            raise DeployError(f"bucket {bucket} exists but is not yours or not readable (403)") from None
        if code not in ("404", "NoSuchBucket", "NotFound"):
            raise
    if not create:
        raise DeployError(f"bucket {bucket} does not exist; create it or pass --create-bucket")
    say(f"creating bucket {bucket}")
    params = {"Bucket": bucket}
    if aws.region != "us-east-1":  # us-east-1 rejects an explicit LocationConstraint
        params["CreateBucketConfiguration"] = {"LocationConstraint": aws.region}
    aws.client("s3").create_bucket(**params)


def package(aws: Aws, model_dir: Path, bucket: str | None, prefix: str, create_bucket: bool) -> str:
    """Archive and upload; returns the s3:// URI of model.tar.gz."""
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "model.tar.gz"
        digest = build_archive(Path(model_dir), archive)
        bucket = bucket or default_bucket(aws)
        key = "/".join(part for part in (prefix.strip("/"), digest[:16], "model.tar.gz") if part)
        ensure_bucket(aws, bucket, create_bucket)
        s3 = aws.client("s3")
        if _exists(s3, bucket, key):
            say(f"s3://{bucket}/{key} already holds this archive")
        else:
            upload_with_progress(s3, archive, bucket, key, {"Metadata": {"sha256": digest}})
    return f"s3://{bucket}/{key}"


def upload_with_progress(s3, path: Path, bucket: str, key: str, extra_args: dict | None = None) -> None:
    """upload_file with a progress bar on stderr: a multi-GB model takes minutes."""
    from tqdm import tqdm

    size = Path(path).stat().st_size
    say(f"uploading {size} bytes to s3://{bucket}/{key}")
    # Not a terminal (CI logs, make's output captured): a line every few seconds instead of
    # a redrawn bar, so the log shows progress without thousands of carriage returns.
    with tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=Path(key).name, file=sys.stderr,
              mininterval=0.5 if sys.stderr.isatty() else 5.0, leave=True) as bar:
        # boto3 calls back from its transfer threads with the bytes sent since the last call.
        s3.upload_file(str(path), bucket, key, ExtraArgs=extra_args or {}, Callback=bar.update)


def _exists(s3, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
        return True
    except ClientError as error:
        if error_code(error) in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
