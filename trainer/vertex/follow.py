"""Following a Vertex AI job after it is created: its states, its error, cancelling it.

    python -m trainer.submit ... --wait          create, then follow to the end
    python -m trainer.submit --attach=JOB        follow a job that exists
    python -m trainer.submit --cancel=JOB        ask Vertex AI to cancel a job

A job is named by its resource name (projects/P/locations/R/customJobs/ID or
.../hyperparameterTuningJobs/ID) or, with `--project` and `--region`, by its
CustomJob ID alone. Following prints one line on stderr per state change, the
console link first and the job's error last; the outcome is the exit code
(`OUTCOME_EXIT_CODES`), so a script can `&&` on it. Ctrl-C stops following and
leaves the job running (`StoppedFollowing`).

Like `client`, this imports the Vertex AI library only inside its calls.
"""

import dataclasses
import re
import sys
import time
from typing import Callable, TextIO

from tfdist import cli
from tfdist.errors import UsageError
from trainer.vertex.checks import quoted
from trainer.vertex.client import CUSTOM_JOB, call_errors
from trainer.vertex.dependencies import require_module

DEFAULT_POLL_SECONDS = 30.0
# Ctrl-C: the shell's code for a program ended by SIGINT (128 + 2).
EXIT_STOPPED_FOLLOWING = 130
SUCCEEDED = "JOB_STATE_SUCCEEDED"
PARTIALLY_SUCCEEDED = "JOB_STATE_PARTIALLY_SUCCEEDED"
# The states after which a job never changes again (the SDK's complete states,
# plus EXPIRED: a FLEX_START job whose max_wait_duration ran out).
TERMINAL_STATES = (
    SUCCEEDED,
    PARTIALLY_SUCCEEDED,
    "JOB_STATE_FAILED",
    "JOB_STATE_CANCELLED",
    "JOB_STATE_EXPIRED",
    "JOB_STATE_PAUSED",
)
# Exit code per final state; 0 only when every trial or replica succeeded.
OUTCOME_EXIT_CODES = {
    SUCCEEDED: cli.EXIT_OK,
    PARTIALLY_SUCCEEDED: cli.EXIT_SERVICE_FAILURE,
    "JOB_STATE_FAILED": cli.EXIT_SERVICE_FAILURE,
    "JOB_STATE_CANCELLED": cli.EXIT_SERVICE_FAILURE,
    "JOB_STATE_EXPIRED": cli.EXIT_SERVICE_FAILURE,
    "JOB_STATE_PAUSED": cli.EXIT_SERVICE_FAILURE,
}
_NAME = re.compile(
    r"^projects/([a-z0-9-]+)/locations/([a-z0-9-]+)/(customJobs|hyperparameterTuningJobs)/([0-9]+)$"
)
_ID = re.compile(r"^[0-9]{1,30}$")


class JobEnded(SystemExit):
    """The followed job reached a final state other than success: exits 1."""

    def __init__(self):
        super().__init__(cli.EXIT_SERVICE_FAILURE)


class StoppedFollowing(SystemExit):
    """Ctrl-C while following: the job keeps running; exits 130."""

    def __init__(self):
        super().__init__(EXIT_STOPPED_FOLLOWING)


@dataclasses.dataclass(frozen=True)
class JobName:
    """A job's resource name, taken apart.

    Attributes:
        project: The project in the name (an ID or a project number).
        region: The Vertex AI region.
        kind: `client.CUSTOM_JOB` or `client.TUNING_JOB`.
        job_id: The numeric ID Vertex AI gave the job.
    """

    project: str
    region: str
    kind: str
    job_id: str

    @property
    def resource_name(self) -> str:
        return f"projects/{self.project}/locations/{self.region}/{self.kind}/{self.job_id}"

    @property
    def console_link(self) -> str:
        """The job's page in the Google Cloud console (the SDK's `_dashboard_uri`)."""
        return (
            f"https://console.cloud.google.com/agent-platform/locations/{self.region}/"
            f"training/{self.job_id}?project={self.project}"
        )

    @property
    def noun(self) -> str:
        return "CustomJob" if self.kind == CUSTOM_JOB else "HyperparameterTuningJob"


def parse_job_name(value: str, *, flag: str, project: str = "", region: str = "") -> JobName:
    """The job `value` names: a resource name, or a CustomJob ID with --project/--region.

    Raises:
        UsageError: Neither form, or an ID without --project and --region.
    """
    value = value.strip()
    match = _NAME.match(value)
    if match:
        return JobName(project=match[1], region=match[2], kind=match[3], job_id=match[4])
    if _ID.match(value):
        if not project or not region:
            raise UsageError(
                f"{flag}={quoted(value)} is a job ID, which needs --project and --region; "
                f"pass them, or the job's full name projects/P/locations/R/customJobs/{value}"
            )
        return JobName(project=project, region=region, kind=CUSTOM_JOB, job_id=value)
    raise UsageError(
        f"{flag} is {quoted(value)}, expected a job's resource name "
        f"(projects/P/locations/R/customJobs/ID or .../hyperparameterTuningJobs/ID) or, "
        f"with --project and --region, a CustomJob ID such as 1234567890"
    )


def _job_service(api_endpoint: str, region: str, credentials):
    aiplatform = require_module("google.cloud.aiplatform_v1", purpose="following a Vertex AI job")
    endpoint = api_endpoint or f"{region}-aiplatform.googleapis.com"
    client = aiplatform.JobServiceClient(
        credentials=credentials, transport="rest", client_options={"api_endpoint": endpoint}
    )
    return client, endpoint


def _state_name(job) -> str:
    state = job.state
    return getattr(state, "name", str(state))


def _error_text(job) -> str:
    message = " ".join(str(job.error.message or "").split())
    return quoted(message, 500) if message else "no error message"


def follow(
    name: JobName,
    *,
    api_endpoint: str = "",
    credentials=None,
    poll_seconds: float = DEFAULT_POLL_SECONDS,
    out: TextIO | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Follows a job until it reaches a final state; returns that state.

    Prints the console link, then one line per state change (QUEUED, PENDING,
    RUNNING, ...), then the job's error if it failed, each on `out`
    (default stderr).

    Args:
        name: The job.
        api_endpoint: Endpoint override, as for `client.create_job`.
        credentials: `google.auth` credentials.
        poll_seconds: Seconds between two reads of the job's state.
        out: Where the lines go.
        sleep: Waits between reads (a test's clock).

    Returns:
        The final state's name, e.g. `JOB_STATE_SUCCEEDED`.

    Raises:
        StoppedFollowing: Ctrl-C; the job is left running.
        UsageError / ServiceError: Vertex AI refused or failed the read.
    """
    out = out or sys.stderr
    client, endpoint = _job_service(api_endpoint, name.region, credentials)
    read = (
        client.get_custom_job if name.kind == CUSTOM_JOB else client.get_hyperparameter_tuning_job
    )
    print(f"Following {name.noun} {name.resource_name}: {name.console_link}", file=out, flush=True)
    started = time.monotonic()
    last_state = None
    try:
        while True:
            with call_errors(
                purpose="following a Vertex AI job",
                refused=f"reading {name.resource_name}",
                expected="a job that exists in this project and region, and permission "
                "to read it (aiplatform.customJobs.get)",
                failed=f"read {name.resource_name}",
                endpoint=endpoint,
            ):
                job = read(name=name.resource_name)
            state = _state_name(job)
            if state != last_state:
                elapsed = int(time.monotonic() - started)
                print(f"{name.resource_name} is {state} ({elapsed} s)", file=out, flush=True)
                last_state = state
            if state in TERMINAL_STATES:
                if state != SUCCEEDED:
                    print(
                        f"error: {name.noun} {name.resource_name} ended {state}: {_error_text(job)}",
                        file=out,
                        flush=True,
                    )
                return state
            sleep(poll_seconds)
    except KeyboardInterrupt:
        print(
            f"Stopped following {name.resource_name}; the job keeps running. Follow it again "
            f"with: python -m trainer.submit --attach={name.resource_name} (or cancel it with "
            f"--cancel={name.resource_name})",
            file=out,
            flush=True,
        )
        raise StoppedFollowing() from None


def cancel(
    name: JobName, *, api_endpoint: str = "", credentials=None, out: TextIO | None = None
) -> None:
    """Asks Vertex AI to cancel the job (it then goes CANCELLING, then CANCELLED).

    Raises:
        UsageError / ServiceError: Vertex AI refused (e.g. the job has ended) or failed.
    """
    out = out or sys.stderr
    client, endpoint = _job_service(api_endpoint, name.region, credentials)
    send = (
        client.cancel_custom_job
        if name.kind == CUSTOM_JOB
        else client.cancel_hyperparameter_tuning_job
    )
    with call_errors(
        purpose="cancelling a Vertex AI job",
        refused=f"to cancel {name.resource_name}",
        expected="a job that has not ended, and permission to cancel it "
        "(aiplatform.customJobs.cancel)",
        failed=f"cancel {name.resource_name}",
        endpoint=endpoint,
    ):
        send(name=name.resource_name)
    print(f"Asked Vertex AI to cancel {name.resource_name}", file=out, flush=True)


def exit_for(state: str) -> None:
    """Returns on success; raises `JobEnded` (exit 1) for any other final state."""
    if OUTCOME_EXIT_CODES.get(state, cli.EXIT_SERVICE_FAILURE) != cli.EXIT_OK:
        raise JobEnded()
