"""package shows its upload's progress (boto3's upload_file Callback into tqdm)."""

from __future__ import annotations

import os
import re


def test_package_upload_reports_progress(aws_env, boto, cli, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    # Random bytes do not compress: the archive stays ~12 MB, over boto3's 8 MB multipart
    # threshold, so the bytes arrive in several callbacks from its transfer threads.
    (model / "model.pt2").write_bytes(os.urandom(12 * 1024 * 1024))
    boto("s3").create_bucket(Bucket="artifacts")
    status, out, err = cli("package", str(model), "--bucket", "artifacts")
    assert status == 0, err
    bucket, key = re.match(r"^s3://([^/]+)/(.+)$", out.strip()).groups()
    size = boto("s3").head_object(Bucket=bucket, Key=key)["ContentLength"]
    assert f"uploading {size} bytes to {out.strip()}" in err
    # The bar's last state: everything sent, in binary units.
    assert re.search(r"model\.tar\.gz: 100%.*\b12\.0M/12\.0M\b", err), err
