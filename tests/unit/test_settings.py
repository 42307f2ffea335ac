import pytest

from smserve.settings import MB, Settings, SettingsError, toolkit_notes


def test_defaults():
    s = Settings.from_env({})
    assert s.port == 8080 and s.workers is None and s.graceful_timeout == 25
    assert s.model_dir == "/opt/ml/model" and s.batch is False
    assert s.default_accept is None  # application/json, or a batch request's own line format
    assert s.max_body_bytes == 100 * MB


def test_values_are_read_and_typed():
    s = Settings.from_env({
        "SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_MODEL_SERVER_WORKERS": "3",
        "SAGEMAKER_BATCH": "TRUE", "SAGEMAKER_BATCH_STRATEGY": "single_record",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "20", "SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT": "text/csv; charset=utf-8",
        "SMSERVE_MAX_BATCH_DELAY_MS": "2.5", "SM_MODEL_DIR": "relative/dir",
    })
    assert (s.port, s.workers, s.batch, s.batch_strategy) == (9000, 3, True, "SINGLE_RECORD")
    assert s.max_body_bytes == 20 * MB
    assert s.default_accept == "text/csv"
    assert s.max_batch_delay_ms == 2.5
    assert s.model_dir.endswith("/relative/dir")


def test_batch_mode_defaults_to_a_6_mb_payload_and_long_timeout():
    s = Settings.from_env({"SAGEMAKER_BATCH": "true"})
    assert s.max_body_bytes == 6 * MB
    assert s.request_timeout >= 3600


@pytest.mark.parametrize("env, silent", [
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "1"}, 30),  # a 1 s deadline: the worker is still not killed after 1 s
    ({"SAGEMAKER_TS_RESPONSE_TIMEOUT": "2"}, 30),
    ({}, 60),
    ({"SAGEMAKER_MODEL_SERVER_TIMEOUT": "300"}, 300),
    ({"SAGEMAKER_BATCH": "true"}, 3600),
])
def test_gunicorn_waits_for_a_silent_worker_at_least_30_s_and_the_longest_request(env, silent):
    # A CI run's worker, its answer deadline 1 s and its heartbeat once a second, was
    # killed by the arbiter (WORKER TIMEOUT) while it served on.
    assert Settings.from_env(env).silent_worker_timeout == silent


@pytest.mark.parametrize("variable, value", [
    ("SAGEMAKER_MODEL_SERVER_WORKERS", "zero"),
    ("SAGEMAKER_BIND_TO_PORT", "70000"),
    ("SAGEMAKER_BATCH", "maybe"),
    ("SAGEMAKER_BATCH_STRATEGY", "EVERYTHING"),
    ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "101"),
    ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "soon"),
    ("SAGEMAKER_DEFAULT_INVOCATIONS_ACCEPT", "image/png"),
    ("SMSERVE_MAX_BATCH_DELAY_MS", "nan"),
    ("SMSERVE_MAX_BATCH_DELAY_MS", "inf"),
    ("SMSERVE_MAX_BATCH_DELAY_MS", "1e12"),
    ("SMSERVE_DEVICE", "tpu"),
    ("SMSERVE_LOG_FORMAT", "xml"),
])
def test_an_invalid_value_names_its_variable(variable, value):
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({variable: value})
    assert str(raised.value).startswith(variable)


def test_autocast_and_compile_are_off_unless_asked_for():
    s = Settings.from_env({})
    assert (s.autocast, s.compile_mode) == ("off", "off")
    s = Settings.from_env({"SMSERVE_AUTOCAST": "BF16", "SMSERVE_COMPILE": "Reduce-Overhead"})
    assert (s.autocast, s.compile_mode) == ("bf16", "reduce-overhead")
    assert Settings.from_env({"SMSERVE_AUTOCAST": "fp16", "SMSERVE_COMPILE": "max-autotune"}).compile_mode == "max-autotune"


@pytest.mark.parametrize("variable, value, named", [
    ("SMSERVE_AUTOCAST", "fp8", "off, fp16, bf16"),
    ("SMSERVE_AUTOCAST", "true", "off, fp16, bf16"),
    ("SMSERVE_COMPILE", "inductor", "reduce-overhead"),
    ("SMSERVE_COMPILE", "on", "max-autotune"),
])
def test_autocast_and_compile_name_their_choices(variable, value, named):
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({variable: value})
    assert str(raised.value).startswith(variable) and named in str(raised.value)


# CreateTransformJob takes MaxPayloadInMB=0 ("the payload might be arbitrarily large and
# is transmitted using HTTP chunked encoding") and MaxConcurrentTransforms=0 ("0 or left
# unset: SageMaker checks the optional execution-parameters"); a job that passes either
# on must not stop `serve`.


def test_a_batch_job_without_a_payload_limit_gets_the_servers_own():
    s = Settings.from_env({"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0"})
    assert s.max_payload_mb == 0
    assert s.max_body_bytes == 100 * MB  # SMSERVE_MAX_REQUEST_MB's default
    assert "SMSERVE_MAX_REQUEST_MB=100" in s.body_limit_setting
    assert "SAGEMAKER_MAX_PAYLOAD_IN_MB=0" in s.body_limit_setting
    s = Settings.from_env({"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "0", "SMSERVE_MAX_REQUEST_MB": "300"})
    assert s.max_body_bytes == 300 * MB and "SMSERVE_MAX_REQUEST_MB=300" in s.body_limit_setting


def test_a_job_payload_limit_still_applies_and_is_named():
    s = Settings.from_env({"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1", "SMSERVE_MAX_REQUEST_MB": "300"})
    assert s.max_body_bytes == 1 * MB and s.body_limit_setting == "SAGEMAKER_MAX_PAYLOAD_IN_MB=1"


def test_max_concurrent_transforms_0_is_unset():
    assert Settings.from_env({"SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "0"}).max_concurrent_transforms is None
    assert Settings.from_env({"SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "7"}).max_concurrent_transforms == 7


@pytest.mark.parametrize("variable, value", [
    ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "-1"),
    ("SAGEMAKER_MAX_PAYLOAD_IN_MB", "six"),
    ("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", "-1"),
    ("SAGEMAKER_MAX_CONCURRENT_TRANSFORMS", "many"),
])
def test_transform_limits_below_0_are_refused(variable, value):
    with pytest.raises(SettingsError) as raised:
        Settings.from_env({variable: value})
    assert str(raised.value).startswith(variable)


@pytest.mark.parametrize("env, expected", [
    ({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "0"}, {"MaxPayloadInMB": 0, "MaxConcurrentTransforms": 4}),
    ({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "0", "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "64"},
     {"MaxPayloadInMB": 0, "MaxConcurrentTransforms": 64}),  # no payload, so no 100 MB budget to keep
    ({"SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "0"}, {"MaxPayloadInMB": 6, "MaxConcurrentTransforms": 4}),
    ({"SAGEMAKER_MAX_PAYLOAD_IN_MB": "50", "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "0"},
     {"MaxPayloadInMB": 50, "MaxConcurrentTransforms": 2}),
])
def test_execution_parameters_when_the_job_passes_0(env, expected):
    from smserve.engine.worker import capacity

    settings = Settings.from_env({"SAGEMAKER_BATCH": "true", **env})
    assert capacity.execution_parameters(settings, workers=2) == {**expected, "BatchStrategy": "MULTI_RECORD"}


# AWS's PyTorch containers read these with int() and hand them to TorchServe: every whole
# number starts there, so every one starts here, clamped, with one start-log line.
@pytest.mark.parametrize("variable, value, field, taken, note", [
    ("SAGEMAKER_TS_MAX_BATCH_DELAY", "100000", "max_batch_delay_ms", 1000.0, "above 1000: taken as 1000"),
    ("SAGEMAKER_TS_MAX_BATCH_DELAY", "-1", "max_batch_delay_ms", 0.0, "below 0: taken as 0"),
    ("SAGEMAKER_TS_BATCH_SIZE", "0", "max_batch_size", 1, "below 1: taken as 1"),
    ("SAGEMAKER_TS_BATCH_SIZE", "-4", "max_batch_size", 1, "below 1: taken as 1"),
    ("SAGEMAKER_TS_BATCH_SIZE", "99999999999", "max_batch_size", 2**31 - 1, "taken as 2147483647"),
    ("SAGEMAKER_TS_RESPONSE_TIMEOUT", "0", "timeout", 60, "taken as unset"),
    ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "-5", "timeout", 60, "taken as unset"),
    ("SAGEMAKER_MODEL_SERVER_WORKERS", "0", "workers", None, "taken as unset"),
])
def test_a_value_the_pytorch_containers_take_is_clamped_and_said_once(variable, value, field, taken, note):
    assert getattr(Settings.from_env({variable: value}), field) == taken
    notes = toolkit_notes({variable: value})
    assert len(notes) == 1 and notes[0].startswith(f"{variable}={value}") and note in notes[0]


@pytest.mark.parametrize("variable, value, field, taken", [
    ("SAGEMAKER_TS_MAX_BATCH_DELAY", "100", "max_batch_delay_ms", 100.0),
    ("SAGEMAKER_TS_BATCH_SIZE", "8", "max_batch_size", 8),
    ("SAGEMAKER_MODEL_SERVER_WORKERS", "3", "workers", 3),
    ("SAGEMAKER_MODEL_SERVER_TIMEOUT", "120", "timeout", 120),
])
def test_a_value_in_range_is_taken_as_written_with_no_clamp_note(variable, value, field, taken):
    assert getattr(Settings.from_env({variable: value}), field) == taken
    assert not any("taken as" in note for note in toolkit_notes({variable: value}))


def test_the_java_model_servers_settings_are_noted_as_unused():
    notes = toolkit_notes({"SAGEMAKER_MODEL_SERVER_VMARGS": "-Xmx2g", "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS": "30"})
    assert notes == [
        "SAGEMAKER_MODEL_SERVER_TIMEOUT_SECONDS is not used by this server; instead: SAGEMAKER_MODEL_SERVER_TIMEOUT "
        "(seconds an answer may take)",
        "SAGEMAKER_MODEL_SERVER_VMARGS is not used by this server; instead: nothing: this server runs no JVM",
    ]
