"""Living with an endpoint: updates under autoscaling, Failed endpoints, shared models,
and what package makes of symlinks; all against the moto server.

moto has no UpdateEndpoint; add_update_endpoint gives the in-process server one that
applies AWS's documented rule for autoscaled variants, so an update the tool sends in
the wrong order fails here as it would on AWS.
"""

from __future__ import annotations

import io
import tarfile

from tests.deploy.support import Moto, add_update_endpoint, one_error_line

SCALING_DIMENSION = "sagemaker:variant:DesiredInstanceCount"


def targets(boto, *resource_ids):
    scaling = boto("application-autoscaling")
    found = scaling.describe_scalable_targets(ServiceNamespace="sagemaker", ResourceIds=list(resource_ids))["ScalableTargets"]
    return [(t["ResourceId"], t["MinCapacity"], t["MaxCapacity"]) for t in found]


def policies(boto, resource_id):
    found = boto("application-autoscaling").describe_scaling_policies(ServiceNamespace="sagemaker", ResourceId=resource_id)["ScalingPolicies"]
    return [(p["PolicyName"], p["TargetTrackingScalingPolicyConfiguration"]["TargetValue"]) for p in found]


# ---------------------------------------------------------------- update-endpoint and autoscaling

BASE = ("--endpoint-name", "ep", "--model-name", "digits", "--poll-seconds", "0.1")
RID = "endpoint/ep/variant/AllTraffic"


def autoscaled_endpoint(cli):
    status, _, err = cli("create-endpoint", *BASE, "--autoscale", "--min-instances", "1", "--max-instances", "4", "--target-invocations", "250")
    assert status == 0, err


def test_new_instance_type_deregisters_then_restores_autoscaling(aws_env, boto, cli, model, monkeypatch):
    autoscaled_endpoint(cli)
    updates = add_update_endpoint(monkeypatch)
    status, out, err = cli("update-endpoint", *BASE, "--instance-type", "ml.c5.xlarge")
    assert status == 0, err
    assert out.startswith("ep InService ")
    # AWS refuses this update while the variant is a scaling target: it went first...
    [update] = updates
    assert update["ScalableTargets"] == []
    # ...and came back afterwards as it was, without --autoscale having to say so.
    assert targets(boto, RID) == [(RID, 1, 4)]
    assert policies(boto, RID) == [("ep-invocations-per-instance", 250.0)]
    assert f"autoscaling of {RID} restored: 1..4 instances, 1 policies" in err


def test_new_instance_type_with_autoscale_takes_the_new_limits(aws_env, boto, cli, model, monkeypatch):
    autoscaled_endpoint(cli)
    updates = add_update_endpoint(monkeypatch)
    status, _, err = cli("update-endpoint", *BASE, "--instance-type", "ml.c5.xlarge", "--autoscale", "--min-instances", "2",
                         "--max-instances", "6", "--target-invocations", "90")
    assert status == 0, err
    assert updates[0]["ScalableTargets"] == []
    assert targets(boto, RID) == [(RID, 2, 6)]
    assert policies(boto, RID) == [("ep-invocations-per-instance", 90.0)]
    assert "restored" not in err


def test_new_model_keeps_autoscaling_in_place(aws_env, boto, cli, model, role, image, monkeypatch):
    autoscaled_endpoint(cli)
    assert cli("create-model", "--model-name", "digits-2", "--image", image, "--role", role)[0] == 0
    updates = add_update_endpoint(monkeypatch)
    status, _, err = cli("update-endpoint", "--endpoint-name", "ep", "--model-name", "digits-2", "--poll-seconds", "0.1")
    assert status == 0, err
    # AWS allows a model change under autoscaling: nothing was deregistered around it.
    assert updates[0]["ScalableTargets"] == [RID]
    assert "deregistered" not in err and "restored" not in err
    assert targets(boto, RID) == [(RID, 1, 4)]
    assert policies(boto, RID) == [("ep-invocations-per-instance", 250.0)]


def test_failed_update_call_restores_autoscaling(aws_env, boto, cli, model):
    """Without add_update_endpoint moto answers UpdateEndpoint with a 500."""
    autoscaled_endpoint(cli)
    status, _, err = cli("update-endpoint", *BASE, "--instance-type", "ml.c5.xlarge")
    assert status == 1
    assert one_error_line(err).startswith("error: UpdateEndpoint failed")
    # The endpoint still runs its old variant, which stays autoscaled.
    assert targets(boto, RID) == [(RID, 1, 4)]
    assert policies(boto, RID) == [("ep-invocations-per-instance", 250.0)]


def test_teardown_finds_its_scaling_target_among_many(aws_env, boto, cli, model):
    """The account's target list is paginated (50 a page); the endpoint's own must still go."""
    scaling = boto("application-autoscaling")
    others = [f"endpoint/other{i:02d}/variant/AllTraffic" for i in range(60)]
    for rid in others:
        scaling.register_scalable_target(ServiceNamespace="sagemaker", ResourceId=rid, ScalableDimension=SCALING_DIMENSION, MinCapacity=1, MaxCapacity=2)
    autoscaled_endpoint(cli)
    status, out, err = cli("teardown", "--endpoint-name", "ep", "--poll-seconds", "0.1")
    assert status == 0, err
    assert out.splitlines()[0] == "autoscaling of ep: deregistered"
    assert targets(boto, RID) == []
    assert len(targets(boto, *others[:50])) == 50 and len(targets(boto, *others[50:])) == 10


# ---------------------------------------------------------------- Failed endpoints


def test_create_endpoint_on_a_failed_one_says_what_to_do(aws_env, boto, cli, model):
    assert cli("create-endpoint", *BASE)[0] == 0
    failed = Moto.sagemaker_backend().endpoints["ep"]
    failed.endpoint_status = "Failed"
    failed.failure_reason = "The primary container for production variant AllTraffic did not pass the ping health check."
    status, out, err = cli("create-endpoint", *BASE)
    assert (status, out) == (1, "")
    assert one_error_line(err) == (
        "error: endpoint ep is Failed (The primary container for production variant AllTraffic did not pass the ping health "
        "check.); delete it with `python -m deploy teardown --endpoint-name ep --keep-models`, then run create-endpoint again"
    )
    assert "endpoint ep:" not in err  # it did not wait on the old failure
    # Doing what it says works: the model stays, the endpoint comes back.
    status, out, err = cli("teardown", "--endpoint-name", "ep", "--keep-models", "--poll-seconds", "0.1")
    assert status == 0, err
    assert "model" not in out
    assert boto("sagemaker").describe_model(ModelName="digits")["ModelName"] == "digits"
    status, out, err = cli("create-endpoint", *BASE)
    assert status == 0, err
    assert out.startswith("ep InService ")


# ---------------------------------------------------------------- teardown and shared models


def test_teardown_keeps_a_model_another_endpoint_uses(aws_env, boto, cli, model):
    for name in ("staging", "prod"):
        status, _, err = cli("create-endpoint", "--endpoint-name", name, "--model-name", model, "--poll-seconds", "0.1")
        assert status == 0, err
    sagemaker = boto("sagemaker")
    staging_config = sagemaker.describe_endpoint(EndpointName="staging")["EndpointConfigName"]
    status, out, err = cli("teardown", "--endpoint-name", "staging", "--poll-seconds", "0.1")
    assert status == 0, err
    assert out.splitlines() == [
        "endpoint staging: deleted",
        f"endpoint config {staging_config}: deleted",
        "model digits: kept, endpoint prod uses it",
    ]
    assert sagemaker.describe_endpoint(EndpointName="prod")["EndpointStatus"] == "InService"
    assert [m["ModelName"] for m in sagemaker.list_models()["Models"]] == ["digits"]
    # Named explicitly it is kept too; once prod is gone, it goes with it.
    status, out, _ = cli("teardown", "--model-name", "digits")
    assert (status, out) == (0, "model digits: kept, endpoint prod uses it\n")
    status, out, err = cli("teardown", "--endpoint-name", "prod", "--poll-seconds", "0.1")
    assert status == 0, err
    assert out.splitlines()[-1] == "model digits: deleted"
    assert sagemaker.list_models()["Models"] == []


def test_teardown_keep_models_and_model_name_exclude_each_other(aws_env, cli):
    status, _, err = cli("teardown", "--endpoint-name", "ep", "--keep-models", "--model-name", "m")
    assert status == 1
    assert one_error_line(err) == "error: teardown takes --keep-models or --model-name, not both"


# ---------------------------------------------------------------- package and symlinks


def test_package_stores_symlinked_files_as_files(aws_env, boto, cli, model_dir, tmp_path):
    """A model linked in from elsewhere must arrive in /opt/ml/model as the file itself."""
    elsewhere = tmp_path / "cache" / "weights.bin"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"weights" * 100)
    (model_dir / "weights.bin").symlink_to(elsewhere)
    boto("s3").create_bucket(Bucket="artifacts")
    status, out, err = cli("package", str(model_dir), "--bucket", "artifacts")
    assert status == 0, err
    body = boto("s3").get_object(Bucket="artifacts", Key=out.strip().removeprefix("s3://artifacts/"))["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        member = tar.getmember("weights.bin")
        assert member.isfile() and not member.issym()
        assert tar.extractfile(member).read() == elsewhere.read_bytes()


def test_package_refuses_a_broken_symlink(aws_env, cli, model_dir, tmp_path):
    (model_dir / "gone.bin").symlink_to(tmp_path / "nowhere.bin")
    status, out, err = cli("package", str(model_dir), "--bucket", "artifacts")
    assert (status, out) == (1, "")
    assert one_error_line(err) == f"error: {model_dir / 'gone.bin'} is a broken symlink; fix or remove it before packaging"
