"""Helpers the deploy tests share: the moto server's handles and running the tool."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import requests

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
REPO_ROOT = Path(__file__).resolve().parents[2]


class Moto:
    def __init__(self, url: str):
        self.url = url

    def reset(self) -> None:
        requests.post(f"{self.url}/moto-api/reset", timeout=10).raise_for_status()

    def script_invocations(self, *results: dict) -> None:
        """Queue what sagemaker-runtime InvokeEndpoint answers, one result per distinct request."""
        body = {"account_id": ACCOUNT, "region": REGION, "results": list(results)}
        requests.post(f"{self.url}/moto-api/static/sagemaker/endpoint-results", json=body, timeout=10).raise_for_status()

    def start_recording(self) -> None:
        requests.post(f"{self.url}/moto-api/recorder/reset-recording", timeout=10).raise_for_status()
        requests.post(f"{self.url}/moto-api/recorder/start-recording", timeout=10).raise_for_status()

    def recorded(self) -> list[dict]:
        """Requests since start_recording, with the body as bytes under 'raw'."""
        requests.post(f"{self.url}/moto-api/recorder/stop-recording", timeout=10).raise_for_status()
        text = requests.get(f"{self.url}/moto-api/recorder/download-recording", timeout=10).text
        entries = [json.loads(line) for line in text.splitlines() if line.strip()]
        for entry in entries:
            body = entry.get("body") or ""
            entry["raw"] = base64.b64decode(body) if entry.get("body_encoded") else body.encode()
        return entries

    @staticmethod
    def sagemaker_backend():
        from moto.sagemaker.models import sagemaker_backends

        return sagemaker_backends[ACCOUNT][REGION]



def run_module(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m deploy ...` as a user runs it, from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "deploy", *argv],
        cwd=REPO_ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
