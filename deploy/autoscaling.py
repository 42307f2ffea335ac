"""Application Auto Scaling for endpoints: a scalable target, its policies, and the
alarm that wakes a target scaled to zero.

Every call overwrites what is there (RegisterScalableTarget and PutScalingPolicy are
upserts), so running a command again is harmless.
"""

from __future__ import annotations

from dataclasses import dataclass

from botocore.exceptions import ClientError

from deploy.aws import Aws, DeployError, one_line, say

VARIANT_DIMENSION = "sagemaker:variant:DesiredInstanceCount"
COPY_DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
# Scale out fast, in slowly: a cold instance costs minutes of model loading.
_COOLDOWNS = {"ScaleInCooldown": 300, "ScaleOutCooldown": 60}
_POLICY_CONFIGS = ("TargetTrackingScalingPolicyConfiguration", "StepScalingPolicyConfiguration", "PredictiveScalingPolicyConfiguration")


@dataclass(frozen=True)
class Target:
    """What Application Auto Scaling scales: a variant's instances or a component's copies."""

    resource_id: str
    dimension: str = VARIANT_DIMENSION

    def key(self) -> dict:
        return {"ServiceNamespace": "sagemaker", "ResourceId": self.resource_id, "ScalableDimension": self.dimension}


def variant_target(endpoint_name: str, variant_name: str) -> Target:
    return Target(f"endpoint/{endpoint_name}/variant/{variant_name}")


def component_target(component_name: str) -> Target:
    return Target(f"inference-component/{component_name}", COPY_DIMENSION)


def _track(aws: Aws, target: Target, min_capacity: int, max_capacity: int, policy_name: str, tracking: dict) -> str:
    """Register the target and one target-tracking policy on it; returns the policy's ARN."""
    scaling = aws.client("application-autoscaling")
    scaling.register_scalable_target(**target.key(), MinCapacity=min_capacity, MaxCapacity=max_capacity)
    policy = scaling.put_scaling_policy(
        PolicyName=policy_name, PolicyType="TargetTrackingScaling", TargetTrackingScalingPolicyConfiguration={**tracking, **_COOLDOWNS}, **target.key()
    )
    return policy["PolicyARN"]


def autoscale(aws: Aws, endpoint_name: str, variant_name: str, min_capacity: int, max_capacity: int, invocations_per_instance: float) -> str:
    """Scale the variant's instance count on invocations per instance per minute; returns the policy ARN."""
    if not 1 <= min_capacity <= max_capacity:
        raise DeployError(f"autoscaling needs 1 <= --min-instances <= --max-instances, got {min_capacity}..{max_capacity}")
    target = variant_target(endpoint_name, variant_name)
    arn = _track(aws, target, min_capacity, max_capacity, f"{endpoint_name}-invocations-per-instance", {
        # Invocations per instance per minute, averaged over the variant.
        "TargetValue": float(invocations_per_instance),
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"},
    })
    say(f"autoscaling {target.resource_id}: {min_capacity}..{max_capacity} instances at {invocations_per_instance:g} invocations/instance/minute")
    return arn


def backlog_alarm_name(endpoint_name: str) -> str:
    return f"{endpoint_name}-has-backlog-without-capacity"


def autoscale_async(aws: Aws, endpoint_name: str, variant_name: str, min_capacity: int, max_capacity: int, backlog_per_instance: float) -> str:
    """Scale an async endpoint on its queue: ApproximateBacklogSizePerInstance.

    With min_capacity 0 the endpoint scales to zero when idle. Target tracking alone
    never scales out from zero (there is no instance to average over), so, as AWS's
    async guide does, a step policy adds one instance when the HasBacklogWithoutCapacity
    alarm fires. Returns the target policy's ARN.
    """
    if not 0 <= min_capacity <= max_capacity or max_capacity < 1:
        raise DeployError(f"autoscaling needs 0 <= --min-instances <= --max-instances and --max-instances >= 1, got {min_capacity}..{max_capacity}")
    target = variant_target(endpoint_name, variant_name)
    arn = _track(aws, target, min_capacity, max_capacity, f"{endpoint_name}-backlog-per-instance", {
        "TargetValue": float(backlog_per_instance),
        "CustomizedMetricSpecification": {
            "MetricName": "ApproximateBacklogSizePerInstance",
            "Namespace": "AWS/SageMaker",
            "Dimensions": [{"Name": "EndpointName", "Value": endpoint_name}],
            "Statistic": "Average",
        },
    })
    if min_capacity == 0:
        _wake_from_zero(aws, target, backlog_alarm_name(endpoint_name), _FROM_ZERO_STEP)
    say(
        f"autoscaling {target.resource_id}: {min_capacity}..{max_capacity} instances at "
        f"{backlog_per_instance:g} queued requests/instance" + (" (scales to zero when idle)" if min_capacity == 0 else "")
    )
    return arn


def no_capacity_alarm_name(component_name: str) -> str:
    return f"{component_name}-no-capacity"


def autoscale_component(aws: Aws, component_name: str, min_copies: int, max_copies: int, invocations_per_copy: float) -> str:
    """Scale an inference component's copies on invocations per copy per minute.

    With min_copies 0 the component scales to zero copies when idle, and SageMaker then
    releases the instances (ManagedInstanceScaling down to 0). As for async endpoints,
    target tracking cannot leave zero, so AWS's "scale to zero" guide adds a step policy
    run by an alarm on NoCapacityInvocationFailures: a request that found no copy.
    Returns the target policy's ARN.
    """
    if not 0 <= min_copies <= max_copies or max_copies < 1:
        raise DeployError(f"copy autoscaling needs 0 <= minimum copies <= --max-copies and --max-copies >= 1, got {min_copies}..{max_copies}")
    target = component_target(component_name)
    arn = _track(aws, target, min_copies, max_copies, f"{component_name}-invocations-per-copy", {
        "TargetValue": float(invocations_per_copy),
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerInferenceComponentInvocationsPerCopy"},
    })
    if min_copies == 0:
        _wake_from_zero(aws, target, no_capacity_alarm_name(component_name), _FROM_NO_COPY_STEP)
    say(
        f"autoscaling {target.resource_id}: {min_copies}..{max_copies} copies at {invocations_per_copy:g} invocations/copy/minute"
        + (" (scales to zero when idle; the first request after that fails while a copy starts)" if min_copies == 0 else "")
    )
    return arn


# AWS's scale-to-zero guide: one copy at once, on the alarm's highest datapoint.
_FROM_NO_COPY_STEP = {
    "AdjustmentType": "ChangeInCapacity",
    "MetricAggregationType": "Maximum",
    "Cooldown": 60,
    "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
}
_FROM_ZERO_STEP = {
    "AdjustmentType": "ChangeInCapacity",
    "MetricAggregationType": "Average",
    "Cooldown": 300,
    "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}],
}


def _wake_from_zero(aws: Aws, target: Target, name: str, step: dict) -> None:
    """A step policy that adds capacity, and the alarm (of the same name) that runs it."""
    arn = aws.client("application-autoscaling").put_scaling_policy(
        PolicyName=name, PolicyType="StepScaling", StepScalingPolicyConfiguration=step, **target.key()
    )["PolicyARN"]
    put_wake_alarm(aws, target.resource_id, name, arn)


def wake_alarm_name(resource_id: str) -> str:
    """The name of the alarm (and of its step policy) this tool puts on a target that may reach zero."""
    kind, name = resource_id.split("/")[:2]
    return no_capacity_alarm_name(name) if kind == "inference-component" else backlog_alarm_name(name)


def put_wake_alarm(aws: Aws, resource_id: str, name: str, step_policy_arn: str) -> None:
    """The alarm that wakes a target scaled to zero when requests find no capacity."""
    kind, resource = resource_id.split("/")[:2]
    if kind == "inference-component":
        metric = {
            "AlarmDescription": f"requests found no copy of inference component {resource}",
            "MetricName": "NoCapacityInvocationFailures",
            "Dimensions": [{"Name": "InferenceComponentName", "Value": resource}],
            "Statistic": "Sum",
            "EvaluationPeriods": 1,
            "DatapointsToAlarm": 1,
        }
    else:
        metric = {
            "AlarmDescription": f"requests wait for {resource}, which has no instance",
            "MetricName": "HasBacklogWithoutCapacity",
            "Dimensions": [{"Name": "EndpointName", "Value": resource}],
            "Statistic": "Average",
            "EvaluationPeriods": 2,
            "DatapointsToAlarm": 2,
            "TreatMissingData": "missing",
        }
    aws.client("cloudwatch").put_metric_alarm(
        AlarmName=name,
        Namespace="AWS/SageMaker",
        Period=60,
        Threshold=1.0,
        # At least one: AWS's guide writes GreaterThanThreshold 1 for the component's
        # alarm, which waits for a second failed request within the minute.
        ComparisonOperator="GreaterThanOrEqualToThreshold",
        AlarmActions=[step_policy_arn],
        **metric,
    )


def scalable_targets(aws: Aws, resource_ids, dimension: str = VARIANT_DIMENSION) -> list[dict]:
    """The scaling targets of these resources only.

    Asking by ResourceIds keeps the answer to this endpoint's few targets: an account's
    whole list is paginated (50 a page), and targets past the first page were missed.
    """
    ids = list(dict.fromkeys(resource_ids))
    paginator = aws.client("application-autoscaling").get_paginator("describe_scalable_targets")
    found = []
    for start in range(0, len(ids), 50):  # ResourceIds takes 50 at most
        for page in paginator.paginate(ServiceNamespace="sagemaker", ResourceIds=ids[start : start + 50], ScalableDimension=dimension):
            found += page["ScalableTargets"]
    return found


def scaling_policies(aws: Aws, target: Target) -> list[dict]:
    paginator = aws.client("application-autoscaling").get_paginator("describe_scaling_policies")
    found = []
    for page in paginator.paginate(**target.key()):
        found += page["ScalingPolicies"]
    return found


def deregister(aws: Aws, target: Target) -> None:
    """Deregistering a target also deletes its scaling policies (not the alarms)."""
    aws.client("application-autoscaling").deregister_scalable_target(**target.key())


def restore(aws: Aws, described: dict, policies: list[dict]) -> None:
    """Register a deregistered target again with its capacities and policies."""
    scaling = aws.client("application-autoscaling")
    target = Target(described["ResourceId"], described["ScalableDimension"])
    try:
        extra = {"SuspendedState": described["SuspendedState"]} if described.get("SuspendedState") else {}
        scaling.register_scalable_target(**target.key(), MinCapacity=described["MinCapacity"], MaxCapacity=described["MaxCapacity"], **extra)
        for policy in policies:
            config = {name: policy[name] for name in _POLICY_CONFIGS if name in policy}
            arn = scaling.put_scaling_policy(**target.key(), PolicyName=policy["PolicyName"], PolicyType=policy["PolicyType"], **config)["PolicyARN"]
            if policy["PolicyName"] == wake_alarm_name(target.resource_id):
                # The alarm must act on the policy as it is now.
                put_wake_alarm(aws, target.resource_id, policy["PolicyName"], arn)
    except ClientError as error:
        # The endpoint's own outcome matters more than this; say how to finish by hand.
        say(f"note: could not restore autoscaling of {target.resource_id} ({one_line(error)}); rerun update-endpoint with --autoscale "
            f"--min-instances {described['MinCapacity']} --max-instances {described['MaxCapacity']}")
        return
    say(f"autoscaling of {target.resource_id} restored: {described['MinCapacity']}..{described['MaxCapacity']} instances, {len(policies)} policies")
