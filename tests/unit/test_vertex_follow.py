"""trainer.vertex.follow: a job followed to its end through the SDK, against a REST stand-in."""

import io

import pytest

from tests.support.vertex_stand_in import FAILED_JOB_ERROR, running_stand_in
from tfdist.errors import UsageError
from trainer.vertex import follow

PARENT = "projects/test-project/locations/us-central1"


@pytest.fixture(scope="module")
def stand_in():
    with running_stand_in() as server:
        yield server


@pytest.fixture(scope="module")
def credentials():
    from google.auth.credentials import AnonymousCredentials

    return AnonymousCredentials()


def followed(stand_in, credentials, name, *, sleep=None):
    out = io.StringIO()
    waits = []
    state = follow.follow(
        follow.parse_job_name(name, flag="--attach"),
        api_endpoint=stand_in.url,
        credentials=credentials,
        poll_seconds=7.5,
        out=out,
        sleep=sleep or waits.append,
    )
    return state, out.getvalue().splitlines(), waits


def test_a_job_id_is_a_custom_job_in_the_given_project_and_region():
    name = follow.parse_job_name("4242", flag="--attach", project="p-1", region="europe-west4")
    assert name.resource_name == "projects/p-1/locations/europe-west4/customJobs/4242"
    assert name.console_link == (
        "https://console.cloud.google.com/agent-platform/locations/europe-west4/training/4242"
        "?project=p-1"
    )


def test_a_tuning_job_is_named_by_its_resource_name():
    name = follow.parse_job_name(f"{PARENT}/hyperparameterTuningJobs/17", flag="--attach")
    assert (name.kind, name.job_id, name.noun) == (
        "hyperparameterTuningJobs",
        "17",
        "HyperparameterTuningJob",
    )


@pytest.mark.parametrize(
    "value, expected",
    [
        ("4242", "needs --project and --region"),
        ("projects/p/locations/r/trainingPipelines/1", "expected a job's resource name"),
        ("my-job", "expected a job's resource name"),
    ],
)
def test_a_job_name_it_cannot_use_is_one_line(value, expected):
    with pytest.raises(UsageError, match=expected) as raised:
        follow.parse_job_name(value, flag="--attach")
    assert "\n" not in str(raised.value)


def test_a_job_is_followed_through_each_state_to_success(stand_in, credentials):
    name = stand_in.add_job(
        f"{PARENT}/customJobs/1001",
        ("JOB_STATE_QUEUED", "JOB_STATE_PENDING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"),
    )
    state, lines, waits = followed(stand_in, credentials, name)
    assert state == "JOB_STATE_SUCCEEDED"
    assert lines[0].startswith(f"Following CustomJob {name}: https://console.cloud.google.com/")
    assert [line.split(" is ")[1].split()[0] for line in lines[1:]] == [
        "JOB_STATE_QUEUED",
        "JOB_STATE_PENDING",
        "JOB_STATE_RUNNING",
        "JOB_STATE_SUCCEEDED",
    ]
    assert waits == [7.5, 7.5, 7.5]  # one wait between two reads, none after the end
    follow.exit_for(state)  # success returns


def test_a_state_that_does_not_change_is_printed_once(stand_in, credentials):
    name = stand_in.add_job(
        f"{PARENT}/customJobs/1002",
        ("JOB_STATE_RUNNING", "JOB_STATE_RUNNING", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"),
    )
    state, lines, waits = followed(stand_in, credentials, name)
    assert state == "JOB_STATE_SUCCEEDED"
    assert len(lines) == 3 and len(waits) == 3


def test_a_failed_job_ends_with_its_error_and_exit_1(stand_in, credentials):
    name = stand_in.add_job(f"{PARENT}/customJobs/1003", ("JOB_STATE_RUNNING", "JOB_STATE_FAILED"))
    state, lines, _ = followed(stand_in, credentials, name)
    assert state == "JOB_STATE_FAILED"
    assert lines[-1] == (f"error: CustomJob {name} ended JOB_STATE_FAILED: {FAILED_JOB_ERROR!r}")
    with pytest.raises(follow.JobEnded) as ended:
        follow.exit_for(state)
    assert ended.value.code == 1


def test_a_tuning_job_is_read_as_a_tuning_job(stand_in, credentials):
    name = stand_in.add_job(
        f"{PARENT}/hyperparameterTuningJobs/1004",
        ("JOB_STATE_RUNNING", "JOB_STATE_PARTIALLY_SUCCEEDED"),
    )
    state, lines, _ = followed(stand_in, credentials, name)
    assert state == "JOB_STATE_PARTIALLY_SUCCEEDED"
    assert stand_in.requests[-1]["path"] == f"/v1/{name}"
    assert lines[-1].startswith(f"error: HyperparameterTuningJob {name} ended")
    with pytest.raises(follow.JobEnded):
        follow.exit_for(state)


def test_a_cancelled_job_goes_cancelling_then_cancelled(stand_in, credentials):
    name = stand_in.add_job(f"{PARENT}/customJobs/1005", ("JOB_STATE_RUNNING",))
    out = io.StringIO()
    follow.cancel(
        follow.parse_job_name(name, flag="--cancel"),
        api_endpoint=stand_in.url,
        credentials=credentials,
        out=out,
    )
    assert stand_in.requests[-1]["path"] == f"/v1/{name}:cancel"
    assert out.getvalue() == f"Asked Vertex AI to cancel {name}\n"
    state, lines, _ = followed(stand_in, credentials, name)
    assert state == "JOB_STATE_CANCELLED"
    assert [line.split(" is ")[1].split()[0] for line in lines[1:-1]] == [
        "JOB_STATE_CANCELLING",
        "JOB_STATE_CANCELLED",
    ]


def test_cancelling_an_ended_job_is_one_line_naming_the_refusal(stand_in, credentials):
    name = stand_in.add_job(f"{PARENT}/customJobs/1006", ("JOB_STATE_SUCCEEDED",))
    with pytest.raises(UsageError) as raised:
        follow.cancel(
            follow.parse_job_name(name, flag="--cancel"),
            api_endpoint=stand_in.url,
            credentials=credentials,
            out=io.StringIO(),
        )
    message = str(raised.value)
    assert message.startswith(f"Vertex AI refused to cancel {name} (400:")
    assert "JOB_STATE_SUCCEEDED" in message and "\n" not in message


def test_a_job_that_does_not_exist_is_one_line(stand_in, credentials):
    with pytest.raises(UsageError, match=r"refused reading .*/customJobs/999 \(404"):
        followed(stand_in, credentials, f"{PARENT}/customJobs/999")


def test_ctrl_c_stops_following_and_leaves_the_job_running(stand_in, credentials):
    name = stand_in.add_job(f"{PARENT}/customJobs/1007", ("JOB_STATE_RUNNING",))

    def interrupted(seconds):
        raise KeyboardInterrupt

    with pytest.raises(follow.StoppedFollowing) as stopped:
        followed(stand_in, credentials, name, sleep=interrupted)
    assert stopped.value.code == 130
    assert stand_in.state_of(name) == "JOB_STATE_RUNNING"
    assert f"/v1/{name}:cancel" not in [request["path"] for request in stand_in.requests]
