"""Inference components: create-endpoint --inference-component, scale to zero, updates,
invoke and teardown, against the moto server with the components it lacks
(fake_components.py).

moto has no inference components and drops ExecutionRoleArn from endpoint configs, so
the requests are checked as they went over the wire (moto's recorder) and, through the
sent_requests fixture, each against botocore's service model before it was sent.
"""

from __future__ import annotations

import re

import pytest

from deploy.endpoint import DEFAULT_GPU_AMI
from tests.deploy.support import Moto, by_target, one_error_line

COMPONENT = ("create-endpoint", "--endpoint-name", "ep", "--model-name", "digits", "--inference-component", "digits-ic",
             "--memory-mb", "2048", "--poll-seconds", "0.1")
DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
RID = "inference-component/digits-ic"




def test_scale_to_zero_component(aws_env, boto, cli, model, role, sent_requests):
    aws_env.start_recording()
    argv = (*COMPONENT, "--instance-type", "ml.g4dn.xlarge", "--copies", "2", "--cpus", "1", "--min-instances", "0",
            "--max-instances", "3", "--max-copies", "4", "--role", role)
    status, out, err = cli(*argv)
    assert status == 0, err
    recorded = aws_env.recorded()
    [config] = by_target(recorded, "CreateEndpointConfig")
    assert config == {
        "EndpointConfigName": config["EndpointConfigName"],
        # No ModelName and no startup timeouts: the component carries both.
        "ProductionVariants": [{
            "VariantName": "AllTraffic", "InstanceType": "ml.g4dn.xlarge", "InitialInstanceCount": 1, "InferenceAmiVersion": DEFAULT_GPU_AMI,
            "ManagedInstanceScaling": {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 3},
            "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
        }],
        "ExecutionRoleArn": role,
    }
    [component] = by_target(recorded, "CreateInferenceComponent")
    assert component == {
        "InferenceComponentName": "digits-ic",
        "EndpointName": "ep",
        "VariantName": "AllTraffic",
        "Specification": {
            "ModelName": "digits",
            # A GPU instance type: one GPU per copy unless --gpus says otherwise.
            "ComputeResourceRequirements": {"MinMemoryRequiredInMb": 2048, "NumberOfCpuCoresRequired": 1.0, "NumberOfAcceleratorDevicesRequired": 1.0},
            "StartupParameters": {"ModelDataDownloadTimeoutInSeconds": 600, "ContainerStartupHealthCheckTimeoutInSeconds": 600},
        },
        "RuntimeConfig": {"CopyCount": 2},
    }
    assert sent_requests("sagemaker", "CreateInferenceComponent") == [component]  # checked against botocore's model too
    # The endpoint first, then the component, each waited on with its status shown.
    endpoint_arn = boto("sagemaker").describe_endpoint(EndpointName="ep")["EndpointArn"]
    assert out.splitlines() == [f"ep InService {endpoint_arn}",
                                "digits-ic InService arn:aws:sagemaker:us-east-1:123456789012:inference-component/digits-ic"]
    assert re.search(r"^inference component digits-ic: Creating \(\d+s\)$", err, re.MULTILINE), err

    # Copies scale to zero and back: target tracking, and a step policy on the alarm.
    [target] = by_target(recorded, "RegisterScalableTarget")
    assert target == {"ServiceNamespace": "sagemaker", "ResourceId": RID, "ScalableDimension": DIMENSION, "MinCapacity": 0, "MaxCapacity": 4}
    tracking, step = by_target(recorded, "PutScalingPolicy")
    assert tracking == {
        "PolicyName": "digits-ic-invocations-per-copy", "PolicyType": "TargetTrackingScaling",
        "TargetTrackingScalingPolicyConfiguration": {
            "TargetValue": 100.0, "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerInferenceComponentInvocationsPerCopy"},
            "ScaleInCooldown": 300, "ScaleOutCooldown": 60},
        "ServiceNamespace": "sagemaker", "ResourceId": RID, "ScalableDimension": DIMENSION,
    }
    assert step == {
        "PolicyName": "digits-ic-no-capacity", "PolicyType": "StepScaling",
        "StepScalingPolicyConfiguration": {"AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Maximum", "Cooldown": 60,
                                           "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}]},
        "ServiceNamespace": "sagemaker", "ResourceId": RID, "ScalableDimension": DIMENSION,
    }
    [alarm] = boto("cloudwatch").describe_alarms(AlarmNames=["digits-ic-no-capacity"])["MetricAlarms"]
    [policy] = [p for p in boto("application-autoscaling").describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=RID)["ScalingPolicies"]
                if p["PolicyType"] == "StepScaling"]
    assert (alarm["MetricName"], alarm["Namespace"], alarm["Statistic"], alarm["Period"]) == ("NoCapacityInvocationFailures", "AWS/SageMaker", "Sum", 60)
    assert alarm["Dimensions"] == [{"Name": "InferenceComponentName", "Value": "digits-ic"}]
    assert (alarm["EvaluationPeriods"], alarm["DatapointsToAlarm"], alarm["Threshold"]) == (1, 1, 1.0)
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"  # one failed request wakes it
    assert alarm["AlarmActions"] == [policy["PolicyARN"]]

    # Again: everything is found as it is.
    aws_env.start_recording()
    status, again, err = cli(*argv)
    assert (status, again) == (0, out), err
    assert "inference component digits-ic exists (InService)" in err
    assert by_target(aws_env.recorded(), "CreateInferenceComponent") == []


def test_cpu_component_reserves_no_gpu_and_min_one_copy(aws_env, cli, model, role):
    aws_env.start_recording()
    status, _, err = cli(*COMPONENT, "--instance-type", "ml.c5.xlarge", "--autoscale", "--role", role)
    assert status == 0, err
    recorded = aws_env.recorded()
    [component] = by_target(recorded, "CreateInferenceComponent")
    assert component["Specification"]["ComputeResourceRequirements"] == {"MinMemoryRequiredInMb": 2048}
    assert component["RuntimeConfig"] == {"CopyCount": 1}
    [config] = by_target(recorded, "CreateEndpointConfig")
    assert config["ProductionVariants"][0]["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 2}
    [target] = by_target(recorded, "RegisterScalableTarget")
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 2)
    # Not scaled to zero: no step policy, no alarm.
    assert [p["PolicyType"] for p in by_target(recorded, "PutScalingPolicy")] == ["TargetTrackingScaling"]


def test_update_copies_then_model(aws_env, boto, cli, model, role, image, components):
    base = (*COMPONENT, "--instance-type", "ml.c5.xlarge", "--role", role)
    assert cli(*base)[0] == 0
    aws_env.start_recording()
    status, out, err = cli("update-endpoint", *base[1:], "--copies", "3")
    assert status == 0, err
    recorded = aws_env.recorded()
    # The endpoint's config is unchanged; only the copy count moves, without a redeploy.
    assert by_target(recorded, "UpdateEndpoint") == [] and by_target(recorded, "UpdateInferenceComponent") == []
    assert by_target(recorded, "UpdateInferenceComponentRuntimeConfig") == [{"InferenceComponentName": "digits-ic", "DesiredRuntimeConfig": {"CopyCount": 3}}]
    assert components.by_name["digits-ic"]["RuntimeConfig"]["DesiredCopyCount"] == 3
    assert out.splitlines()[1].startswith("digits-ic InService ")

    assert cli("create-model", "--model-name", "digits-2", "--image", image, "--role", role)[0] == 0
    aws_env.start_recording()
    status, _, err = cli("update-endpoint", *base[1:4], "digits-2", *base[5:], "--copies", "3")
    assert status == 0, err
    [update] = by_target(aws_env.recorded(), "UpdateInferenceComponent")
    assert update == {
        "InferenceComponentName": "digits-ic",
        "Specification": {"ModelName": "digits-2", "ComputeResourceRequirements": {"MinMemoryRequiredInMb": 2048},
                          "StartupParameters": {"ModelDataDownloadTimeoutInSeconds": 600, "ContainerStartupHealthCheckTimeoutInSeconds": 600}},
        "RuntimeConfig": {"CopyCount": 3},
    }
    assert re.search(r"^inference component digits-ic: Updating \(\d+s\)$", err, re.MULTILINE), err
    # create-endpoint with other resources does not change a component behind the user's back.
    status, _, err = cli(*base, "--memory-mb", "4096")
    assert status == 1
    assert one_error_line(err) == "error: inference component digits-ic exists with another model or resources; use update-endpoint to change it"


def test_teardown_removes_components_first(aws_env, boto, cli, model, role, components):
    status, _, err = cli(*COMPONENT, "--instance-type", "ml.c5.xlarge", "--min-instances", "0", "--role", role)
    assert status == 0, err
    config = boto("sagemaker").describe_endpoint(EndpointName="ep")["EndpointConfigName"]
    status, out, err = cli("teardown", "--endpoint-name", "ep", "--poll-seconds", "0.1")
    assert status == 0, err
    # The fake refuses DeleteEndpoint while a component is on it, as SageMaker does.
    assert out.splitlines() == [
        "autoscaling of inference component digits-ic: deregistered",
        "alarm digits-ic-no-capacity: deleted",
        "inference component digits-ic: deleted",
        "endpoint ep: deleted",
        f"endpoint config {config}: deleted",
        "model digits: deleted",
    ]
    assert re.search(r"^inference component digits-ic: Deleting \(\d+s\)$", err, re.MULTILINE), err
    assert components.by_name == {}
    assert boto("application-autoscaling").describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert boto("cloudwatch").describe_alarms(AlarmNames=["digits-ic-no-capacity"])["MetricAlarms"] == []


def test_teardown_keeps_a_model_another_endpoints_component_uses(aws_env, boto, cli, model, role):
    assert cli(*COMPONENT, "--instance-type", "ml.c5.xlarge", "--role", role)[0] == 0
    assert cli("create-endpoint", "--endpoint-name", "plain", "--model-name", "digits", "--poll-seconds", "0.1")[0] == 0
    status, out, err = cli("teardown", "--endpoint-name", "plain", "--poll-seconds", "0.1")
    assert status == 0, err
    assert out.splitlines()[-1] == "model digits: kept, endpoint ep uses it"
    assert boto("sagemaker").describe_model(ModelName="digits")["ModelName"] == "digits"


def test_a_failed_component_is_one_line(aws_env, cli, model, role, components):
    components.fail_next = "The model container did not pass the ping health check.\nSee the logs."
    status, out, err = cli(*COMPONENT, "--instance-type", "ml.c5.xlarge", "--role", role)
    assert status == 1
    assert out.startswith("ep InService ")  # the endpoint itself stands
    assert one_error_line(err) == "error: inference component digits-ic is Failed: The model container did not pass the ping health check. See the logs."


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--copies", "2"], "error: --copies configures an inference component: add --inference-component NAME"),
        (["--role", "arn:aws:iam::123456789012:role/r"], "error: --role configures an inference component: add --inference-component NAME"),
        (["--inference-component", "ic"], "error: --inference-component needs --memory-mb (memory reserved for each copy)"),
        (["--inference-component", "ic", "--memory-mb", "1024", "--serverless-memory", "2048"],
         "error: inference components run on instances; drop --serverless-memory or --inference-component"),
        (["--inference-component", "ic", "--memory-mb", "1024", "--async-output", "s3://out/r"],
         "error: inference components serve real-time requests; drop --async-output or --inference-component"),
        (["--inference-component", "ic", "--memory-mb", "1024", "--instance-type", "ml.m5.large", "--gpus", "1", "--role", "arn:aws:iam::1:role/r"],
         "error: --gpus reserves accelerators, which ml.m5.large has none of; pick an ml.g*/ml.p* --instance-type"),
        (["--inference-component", "ic", "--memory-mb", "100", "--role", "arn:aws:iam::1:role/r"],
         "error: --memory-mb must be at least 128 (MB reserved for each copy), got 100"),
        (["--inference-component", "ic", "--memory-mb", "1024", "--cpus", "0.1", "--role", "arn:aws:iam::1:role/r"],
         "error: --cpus must be at least 0.25, got 0.1"),
        (["--inference-component", "ic", "--memory-mb", "1024", "--instance-count", "3", "--max-instances", "2", "--role", "arn:aws:iam::1:role/r"],
         "error: an endpoint of inference components needs --min-instances <= --instance-count <= --max-instances, got 3, 3, 2"),
        (["--inference-component", "ic", "--memory-mb", "1024"],
         "error: an endpoint of inference components needs an execution role: pass --role arn:aws:iam::ACCOUNT:role/NAME or set SAGEMAKER_ROLE_ARN"),
        (["--inference-component", "ic", "--memory-mb", "1024", "--role", "arn:aws:iam::1:role/r", "--metrics-interval", "45"],
         "error: --metrics-interval must be one of 10, 30, 60, 120, 180, 240, 300 (seconds), got 45"),
    ],
)
def test_component_refusals_create_nothing(aws_env, boto, cli, model, flags, message):
    aws_env.start_recording()
    status, out, err = cli("create-endpoint", "--endpoint-name", "ep", "--model-name", "digits", *flags)
    assert (status, out) == (1, "")
    assert one_error_line(err) == message
    assert aws_env.recorded() == []
    assert boto("sagemaker").list_endpoint_configs()["EndpointConfigs"] == []


def test_component_of_a_missing_model_creates_no_endpoint(aws_env, boto, cli, role):
    status, _, err = cli(*COMPONENT[:4], "nope", *COMPONENT[5:], "--role", role)
    assert status == 1
    assert one_error_line(err) == "error: model nope does not exist; run create-model first"
    assert boto("sagemaker").list_endpoints()["Endpoints"] == []
    assert Moto.sagemaker_backend().endpoint_configs == {}
