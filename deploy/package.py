"""package: a model directory -> model.tar.gz in S3 (or, for a multi-model endpoint,
several <name>.tar.gz under one prefix; or, uncompressed, the directory's files as they are).

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
    files = _files(model_dir)

    with open(destination, "wb") as raw:
        # mtime=0 and no file name in the gzip header keep the bytes reproducible.
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped:
            # dereference: a symlinked file (a model linked in from a cache) is stored as
            # the file it points at; a link would dangle in /opt/ml/model.
            with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT, dereference=True) as archive:
                for relative in files:
                    path = model_dir / relative
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
    return _sha256(destination)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _files(model_dir: Path) -> list[str]:
    """The directory's files to package, relative and sorted; refuses what would not arrive."""
    if not model_dir.is_dir():
        raise DeployError(f"model directory {model_dir} does not exist (run `make model` for the example)")
    files = sorted(_walk(model_dir))
    if not files:
        raise DeployError(f"model directory {model_dir} is empty")
    for relative in files:
        if not (model_dir / relative).exists():
            raise DeployError(f"{model_dir / relative} is a broken symlink; fix or remove it before packaging")
    return files


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
        key = _key(prefix, digest[:16], "model.tar.gz")
        ensure_bucket(aws, bucket, create_bucket)
        s3 = aws.client("s3")
        if head(s3, bucket, key) is not None:
            say(f"s3://{bucket}/{key} already holds this archive")
        else:
            upload_with_progress(s3, archive, bucket, key, {"Metadata": {"sha256": digest}})
    return f"s3://{bucket}/{key}"


def package_multi_model(aws: Aws, model_dirs: list[Path], bucket: str | None, prefix: str, create_bucket: bool) -> str:
    """Each directory as <its name>.tar.gz under one prefix; returns the prefix's s3:// URI.

    The prefix is stable (not content-hashed), as a multi-model endpoint reads it: new
    models are added beside the others. An archive is never replaced: an endpoint that
    loaded the old one keeps serving it, so a changed model needs a new name.
    """
    names = [Path(d).name for d in model_dirs]
    for name in names:
        if names.count(name) > 1:
            raise DeployError(f"two model directories are named {name}; each becomes {name}.tar.gz, so their names must differ")
    bucket = bucket or default_bucket(aws)
    with tempfile.TemporaryDirectory() as scratch:
        archives = []
        for directory, name in zip(model_dirs, names):
            path = Path(scratch) / f"{name}.tar.gz"
            archives.append((path, _key(prefix, f"{name}.tar.gz"), build_archive(Path(directory), path)))
        ensure_bucket(aws, bucket, create_bucket)
        s3 = aws.client("s3")
        uploads = []
        for path, key, digest in archives:  # all checked before any is uploaded
            held = head(s3, bucket, key)
            if held is None:
                uploads.append((path, key, {"Metadata": {"sha256": digest}}))
            elif held.get("Metadata", {}).get("sha256") == digest:
                say(f"s3://{bucket}/{key} already holds this archive")
            else:
                name = key.rsplit("/", 1)[-1].removesuffix(".tar.gz")
                raise DeployError(
                    f"s3://{bucket}/{key} holds another archive; endpoints that loaded it keep serving it, so a new version "
                    f"needs a new name (a directory named {name}-v2)"
                )
        upload_all(s3, bucket, uploads)
    return f"s3://{bucket}/{_key(prefix)}/"


def package_uncompressed(aws: Aws, model_dir: Path, bucket: str | None, prefix: str, create_bucket: bool) -> str:
    """The directory's files as they are, under s3://BUCKET/PREFIX/<hash of the tree>/.

    SageMaker copies them to /opt/ml/model with their relative paths (create-model
    --uncompressed): nothing to unpack. Returns the prefix's s3:// URI, ending in /.
    """
    model_dir = Path(model_dir)
    files = _files(model_dir)
    digests = {relative: _sha256(model_dir / relative) for relative in files}
    tree = hashlib.sha256("".join(f"{name}\0{digest}\n" for name, digest in digests.items()).encode()).hexdigest()
    bucket = bucket or default_bucket(aws)
    base = _key(prefix, tree[:16])
    ensure_bucket(aws, bucket, create_bucket)
    s3 = aws.client("s3")
    # The prefix is named by the content, so a key already there holds its file (S3 shows an object only once it is whole).
    uploads = [(model_dir / name, f"{base}/{name}", {"Metadata": {"sha256": digest}})
               for name, digest in digests.items() if head(s3, bucket, f"{base}/{name}") is None]
    if not uploads:
        say(f"s3://{bucket}/{base}/ already holds these files")
    upload_all(s3, bucket, uploads)
    return f"s3://{bucket}/{base}/"


def _key(*parts: str) -> str:
    return "/".join(part.strip("/") for part in parts if part.strip("/"))


def upload_with_progress(s3, path: Path, bucket: str, key: str, extra_args: dict | None = None) -> None:
    """upload_file with a progress bar on stderr: a multi-GB model takes minutes."""
    upload_all(s3, bucket, [(Path(path), key, extra_args or {})])


def upload_all(s3, bucket: str, uploads: list[tuple[Path, str, dict]]) -> None:
    """Upload (file, key, ExtraArgs) triples under one progress bar on stderr."""
    from tqdm import tqdm

    if not uploads:
        return
    size = sum(Path(path).stat().st_size for path, _, _ in uploads)
    if len(uploads) == 1:
        say(f"uploading {size} bytes to s3://{bucket}/{uploads[0][1]}")
        label = Path(uploads[0][1]).name
    else:
        common = os.path.commonpath([key for _, key, _ in uploads])
        say(f"uploading {len(uploads)} files, {size} bytes, to s3://{bucket}/{common}/")
        label = f"{len(uploads)} files"
    # Not a terminal (CI logs, make's output captured): a line every few seconds instead of
    # a redrawn bar, so the log shows progress without thousands of carriage returns.
    with tqdm(total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=label, file=sys.stderr,
              mininterval=0.5 if sys.stderr.isatty() else 5.0, leave=True) as bar:
        for path, key, extra_args in uploads:
            # boto3 calls back from its transfer threads with the bytes sent since the last call.
            s3.upload_file(str(path), bucket, key, ExtraArgs=extra_args, Callback=bar.update)


def head(s3, bucket: str, key: str) -> dict | None:
    """The object's head, or None when there is none."""
    try:
        return s3.head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error_code(error) in ("404", "NoSuchKey", "NotFound"):
            return None
        raise
