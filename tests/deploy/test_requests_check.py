"""The request check the deploy tests rely on refuses what SageMaker would (and botocore lets through)."""

from __future__ import annotations

import boto3
import pytest
from botocore.stub import Stubber

from tests.deploy.requests_check import RequestLog


def sagemaker_with_check():
    # Nothing is sent: a refused request stops in the hook, an accepted one at the Stubber.
    client = boto3.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x").client("sagemaker")
    log = RequestLog()
    client.meta.events.register("before-parameter-build.*.*", log.hook("sagemaker"))
    return client, log


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"ProductionVariants": [{"VariantName": "v", "RoutingConfig": {"RoutingStrategy": "FASTEST"}}]}, "is not one of"),
        ({"ProductionVariants": [{"VariantName": "v", "ContainerStartupHealthCheckTimeoutInSeconds": 7200}]}, "outside 60..3600"),
        ({"ProductionVariants": [{"VariantName": "not a name"}]}, "does not match"),
        ({"ProductionVariants": [{"VariantName": "v", "ModelNmae": "m"}]}, "Unknown parameter"),
    ],
)
def test_requests_off_the_model_are_refused(params, problem):
    client, log = sagemaker_with_check()
    with pytest.raises(AssertionError, match=problem):
        client.create_endpoint_config(EndpointConfigName="c", **params)
    assert log.calls == []


def test_a_request_on_the_model_is_logged():
    client, log = sagemaker_with_check()
    stubber = Stubber(client)
    stubber.activate()
    request = {"EndpointConfigName": "c", "ProductionVariants": [{"VariantName": "v", "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}}]}
    stubber.add_response("create_endpoint_config", {"EndpointConfigArn": "arn:aws:sagemaker:us-east-1:123456789012:endpoint-config/c"}, request)
    client.create_endpoint_config(**request)
    assert log("sagemaker", "CreateEndpointConfig") == [request]
