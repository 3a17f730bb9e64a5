"""Creates a CustomJob through the Vertex AI SDK (google-cloud-aiplatform).

Kept apart from `trainer.submit` because importing the SDK takes seconds:
only a real submission pays for it, never `--dry_run`.
"""

import json
import logging
import sys
from typing import Any, Mapping

from google.api_core import exceptions as api_exceptions
from google.auth import exceptions as auth_exceptions
from google.cloud import aiplatform
from google.cloud.aiplatform_v1.types import custom_job as custom_job_types

from tfdist.errors import UsageError
from trainer.job_spec import JobSpec


def create_custom_job(custom_job: Mapping[str, Any], spec: JobSpec, *, project: str,
                      region: str, staging_bucket: str, api_endpoint: str = "",
                      credentials=None) -> str:
    """Sends the CustomJob built by `trainer.job_spec.build_custom_job`.

    Args:
        custom_job: The REST-shaped CustomJob; its worker pools are sent as is.
        spec: The same job, for the settings the SDK takes as arguments.
        project: Google Cloud project ID.
        region: Vertex AI region.
        staging_bucket: gs:// bucket the SDK requires.
        api_endpoint: Endpoint override; empty for the regional endpoint.
        credentials: `google.auth` credentials: Application Default Credentials,
            or `AnonymousCredentials` for a loopback emulator. `None` lets the
            SDK look up Application Default Credentials itself.

    Returns:
        The created job's resource name, projects/P/locations/R/customJobs/ID.

    Raises:
        UsageError: No credentials, or Vertex AI refused the job (4xx).
    """
    _keep_stdout_for_the_result()
    try:
        return _submit(custom_job, spec, project=project, region=region,
                       staging_bucket=staging_bucket, api_endpoint=api_endpoint,
                       credentials=credentials)
    except auth_exceptions.DefaultCredentialsError:
        raise UsageError(
            "no Application Default Credentials found, expected credentials to call Vertex "
            "AI; run `gcloud auth application-default login` or point "
            "GOOGLE_APPLICATION_CREDENTIALS at a key file") from None
    except auth_exceptions.RefreshError:
        raise UsageError("Application Default Credentials could not be refreshed (expired "
                         "or revoked); run `gcloud auth application-default login` "
                         "again") from None
    except api_exceptions.GoogleAPICallError as error:
        summary = " ".join(str(error.message or "").split())[:300]
        if error.code is not None and 400 <= int(error.code) < 500:
            raise UsageError(f"Vertex AI refused the job ({int(error.code)}: {summary}); "
                             f"expected a job it accepts: check the machine types, quota "
                             f"and permissions in {region}") from None
        print(f"error: Vertex AI failed to create the job ({error.code}: {summary})",
              file=sys.stderr)
        sys.exit(1)


def _submit(custom_job, spec, *, project, region, staging_bucket, api_endpoint, credentials):
    aiplatform.init(project=project, location=region, credentials=credentials,
                    api_endpoint=api_endpoint or None, api_transport="rest",
                    staging_bucket=staging_bucket)
    pools = [custom_job_types.WorkerPoolSpec.from_json(json.dumps(pool))
             for pool in custom_job["jobSpec"]["workerPoolSpecs"]]
    job = aiplatform.CustomJob(display_name=spec.display_name, worker_pool_specs=pools,
                               base_output_dir=spec.base_output_dir,
                               labels=dict(spec.labels) or None,
                               staging_bucket=staging_bucket)
    scheduling = spec.scheduling
    job.submit(service_account=spec.service_account or None,
               timeout=scheduling.timeout_seconds or None,
               restart_job_on_worker_restart=scheduling.restart_job_on_worker_restart,
               enable_web_access=spec.enable_web_access,
               tensorboard=spec.tensorboard or None,
               scheduling_strategy=custom_job_types.Scheduling.Strategy[
                   scheduling.strategy.upper()],
               max_wait_duration=scheduling.max_wait_seconds)
    return job.resource_name


def _keep_stdout_for_the_result() -> None:
    """Sends the SDK's progress lines to stderr (via logging) instead of stdout.

    The SDK adds a stdout handler to its loggers; our stdout carries only the
    created job's resource name, so scripts can read it.
    """
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if not name.startswith("google.cloud.aiplatform") or \
                not isinstance(logger, logging.Logger):
            continue
        for handler in list(logger.handlers):
            if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
                logger.removeHandler(handler)
