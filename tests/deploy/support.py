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
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/sagemaker-pytorch-byoc:v1"


def one_error_line(err: str) -> str:
    """The failure's one line: the last on stderr, the only error, no traceback."""
    assert "Traceback" not in err
    assert err.count("error:") == 1, err
    last = err.splitlines()[-1]
    assert last.startswith("error: "), err
    return last


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



def by_target(recorded: list[dict], target: str) -> list[dict]:
    """Bodies of the recorded JSON requests to one API action (X-Amz-Target ends with it)."""
    return [json.loads(r["raw"]) for r in recorded if r["headers"].get("X-Amz-Target", "").endswith("." + target)]


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


def add_update_endpoint(monkeypatch, settle_seconds: float = 0.3) -> list[dict]:
    """Give the in-process moto server the UpdateEndpoint it lacks (5.2.5 answers 500).

    It does what SageMaker does, as far as the tool can see: the endpoint moves to the
    new config, is Updating for a moment, then InService again. It also applies the rule
    AWS documents for autoscaled endpoints ("Update endpoints that use auto scaling"):
    an update that changes the instance type of a variant with a scalable target, or
    removes such a variant, fails. Returns the list of updates it accepted.
    """
    import threading

    from moto.applicationautoscaling.models import applicationautoscaling_backends
    from moto.core.responses import ActionResult
    from moto.sagemaker.exceptions import ValidationError
    from moto.sagemaker.responses import SageMakerResponse

    accepted: list[dict] = []

    def update_endpoint(self):
        name = self._get_param("EndpointName")
        config_name = self._get_param("EndpointConfigName")
        backend = self.sagemaker_backend
        endpoint = backend.endpoints.get(name)
        if endpoint is None:
            raise ValidationError(message=f"Could not find endpoint '{name}'.")
        if config_name not in backend.endpoint_configs:
            raise ValidationError(message=f"Could not find endpoint configuration '{config_name}'.")
        old = backend.endpoint_configs[endpoint.endpoint_config_name].production_variants
        new = {v["VariantName"]: v for v in backend.endpoint_configs[config_name].production_variants}
        scaling = applicationautoscaling_backends[ACCOUNT][REGION]
        scaled = {t.resource_id for t in scaling.describe_scalable_targets("sagemaker", None, None)}
        for variant in old:
            if f"endpoint/{name}/variant/{variant['VariantName']}" not in scaled:
                continue
            kept = new.get(variant["VariantName"])
            if kept is None or kept["InstanceType"] != variant["InstanceType"]:
                raise ValidationError(
                    message=f"The variant {variant['VariantName']} is autoscaled: deregister its scalable target before this update."
                )
        endpoint.endpoint_config_name = config_name
        endpoint.production_variants = endpoint._process_production_variants(list(new.values()))
        endpoint.endpoint_status = "Updating"
        accepted.append({"EndpointName": name, "EndpointConfigName": config_name, "ScalableTargets": sorted(scaled)})

        def settle():
            endpoint.endpoint_status = "InService"

        threading.Timer(settle_seconds, settle).start()
        return ActionResult({"EndpointArn": endpoint.arn})

    monkeypatch.setattr(SageMakerResponse, "update_endpoint", update_endpoint, raising=False)
    return accepted
