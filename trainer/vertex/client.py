"""Sends a job to Vertex AI through its client library (google-cloud-aiplatform).

The REST body is exactly the JSON the dry run prints: it is parsed into the
library's own message type (`CustomJob` or `HyperparameterTuningJob`, unknown
fields refused) and sent with `JobServiceClient` over REST, so a local HTTP
server can stand in for Vertex AI in tests. Importing the library takes
seconds: only a real submission pays for it, never `--dry_run`.

Every failure is one line: `UsageError` (exit 2) for what the user can fix
(credentials, a 4xx refusal, a body the schema refuses), `ServiceError`
(exit 1) for Vertex AI's own failures (5xx, unreachable).
"""

import contextlib
import json
import logging
import sys
from typing import Any, Mapping

from tfdist.errors import UsageError
from trainer.vertex.checks import ServiceError, quoted
from trainer.vertex.dependencies import require_module

CUSTOM_JOB = "customJobs"
TUNING_JOB = "hyperparameterTuningJobs"
NO_CREDENTIALS = (
    "no Application Default Credentials found, expected credentials to call "
    "Vertex AI; run `gcloud auth application-default login` or point "
    "GOOGLE_APPLICATION_CREDENTIALS at a key file"
)


def create_job(
    kind: str,
    resource: Mapping[str, Any],
    *,
    project: str,
    region: str,
    api_endpoint: str = "",
    credentials=None,
) -> str:
    """Creates a CustomJob or HyperparameterTuningJob.

    Args:
        kind: `CUSTOM_JOB` or `TUNING_JOB`.
        resource: The REST-shaped job, as `trainer.vertex.rendering` or
            `trainer.vertex.tuning` built it.
        project: Google Cloud project ID.
        region: Vertex AI region.
        api_endpoint: Endpoint override (host[:port], https:// URL, or a
            loopback http:// URL); empty for `REGION-aiplatform.googleapis.com`.
        credentials: `google.auth` credentials (ADC, or anonymous for a
            loopback emulator).

    Returns:
        The created job's resource name, projects/P/locations/R/<kind>/ID.

    Raises:
        UsageError: No usable credentials, the body does not parse, or
            Vertex AI refused the job (4xx).
        ServiceError: Vertex AI failed (5xx) or could not be reached.
    """
    aiplatform = require_module(
        "google.cloud.aiplatform_v1", purpose="submitting a job to Vertex AI"
    )
    from google.protobuf import json_format

    keep_stdout_for_the_result()
    endpoint = api_endpoint or f"{region}-aiplatform.googleapis.com"
    parent = f"projects/{project}/locations/{region}"
    try:
        with call_errors(
            purpose="submitting a job to Vertex AI",
            refused="the job",
            expected=f"a job it accepts: check the machine types, quota and "
            f"permissions in {region}",
            failed="create the job",
            endpoint=endpoint,
        ):
            client = aiplatform.JobServiceClient(
                credentials=credentials, transport="rest", client_options={"api_endpoint": endpoint}
            )
            body = json.dumps(resource)
            if kind == CUSTOM_JOB:
                job = aiplatform.CustomJob.from_json(body, ignore_unknown_fields=False)
                created = client.create_custom_job(parent=parent, custom_job=job)
            else:
                job = aiplatform.HyperparameterTuningJob.from_json(
                    body, ignore_unknown_fields=False
                )
                created = client.create_hyperparameter_tuning_job(
                    parent=parent, hyperparameter_tuning_job=job
                )
            return created.name
    except json_format.ParseError as error:
        raise UsageError(
            f"the job does not parse as a Vertex AI {kind[:-1]} "
            f"({quoted(str(error))}); expected values within the API's "
            f"ranges"
        ) from None


@contextlib.contextmanager
def call_errors(*, purpose: str, refused: str, expected: str, failed: str, endpoint: str):
    """Turns what a Vertex AI client call raises into one line a user can act on.

    Args:
        purpose: What the call is for, should a library be missing.
        refused: What Vertex AI refuses with a 4xx, e.g. "the job".
        expected: What it would accept, after "expected".
        failed: What failed with a 5xx, after "failed to", e.g. "create the job".
        endpoint: The endpoint called, for an unreachable one.

    Raises:
        UsageError: No usable credentials, or Vertex AI refused the call (4xx).
        ServiceError: Vertex AI failed (5xx) or could not be reached.
    """
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions

    requests = require_module("requests", purpose=purpose)

    try:
        yield
    except auth_exceptions.DefaultCredentialsError:
        raise UsageError(NO_CREDENTIALS) from None
    except auth_exceptions.RefreshError:
        raise UsageError(
            "Application Default Credentials could not be refreshed (expired "
            "or revoked); run `gcloud auth application-default login` "
            "again"
        ) from None
    except api_exceptions.GoogleAPICallError as error:
        summary = quoted(" ".join(str(error.message or "").split()), 300)
        if error.code is not None and 400 <= int(error.code) < 500:
            raise UsageError(
                f"Vertex AI refused {refused} ({int(error.code)}: {summary}); expected {expected}"
            ) from None
        raise ServiceError(
            f"Vertex AI failed to {failed} ({error.code}: {summary}); try again later"
        ) from None
    except (requests.exceptions.RequestException, auth_exceptions.TransportError) as error:
        raise ServiceError(
            f"Vertex AI at {quoted(endpoint)} could not be reached "
            f"({quoted(_last_line(error))}); check the network and "
            f"--api_endpoint"
        ) from None


def _last_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[-1]


def keep_stdout_for_the_result() -> None:
    """Sends the library's progress lines to stderr instead of stdout.

    Our stdout carries only the created job's resource name, so scripts can
    read it.
    """
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not name.startswith("google.cloud.aiplatform") or not isinstance(logger, logging.Logger):
            continue
        for handler in list(logger.handlers):
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                logger.removeHandler(handler)
