"""The gcloud and SDK lines that upload the exported SavedModel and deploy it.

The chief exports a SavedModel into `AIP_MODEL_DIR` (`<base_output_dir>/model/`,
or `<base_output_dir>/<trial_id>/model/` for a tuning trial) with
`--export=savedmodel` or `both` (the default on Vertex AI), which Vertex AI
Prediction's prebuilt TensorFlow containers serve.
"""

import shlex

from trainer.vertex import images

# The newest TensorFlow prediction image Vertex AI lists (dated data:
# trainer/vertex/tables/images.json, `default_prediction_image`).
DEFAULT_SERVING_IMAGE = images.DEFAULT_PREDICTION_IMAGE
DEFAULT_SERVING_MACHINE = "n1-standard-4"


def serving_commands(
    *,
    project: str,
    region: str,
    display_name: str,
    base_output_dir: str,
    tuning: bool,
    image: str = DEFAULT_SERVING_IMAGE,
    machine_type: str = DEFAULT_SERVING_MACHINE,
) -> list[str]:
    """Shell lines (gcloud) and the equivalent Python (SDK), ready to paste.

    Args:
        project, region: Where the model and endpoint go.
        display_name: The job's name; the model and endpoint are named after it.
        base_output_dir: The job's `baseOutputDirectory`.
        tuning: A tuning job: the artifact directory is a trial's (TRIAL_ID is
            left for the user to fill in with the best trial's id).
        image: A Vertex AI prebuilt TensorFlow prediction image.
        machine_type: The serving machine.
    """
    artifacts = f"{base_output_dir}/TRIAL_ID/model/" if tuning else f"{base_output_dir}/model/"
    where = f"--project={shlex.quote(project)} --region={shlex.quote(region)}"
    name = shlex.quote(display_name)
    return [
        f"gcloud ai models upload {where} --display-name={name} "
        f"--artifact-uri={shlex.quote(artifacts)} --container-image-uri={shlex.quote(image)}",
        f"gcloud ai endpoints create {where} "
        f"--display-name={shlex.quote(display_name + '-endpoint')}",
        f"gcloud ai endpoints deploy-model ENDPOINT_ID {where} --model=MODEL_ID "
        f"--display-name={name} --machine-type={shlex.quote(machine_type)}",
        "# or, in Python with google-cloud-aiplatform:",
        f"# aiplatform.init(project={project!r}, location={region!r}); "
        f"aiplatform.Model.upload(display_name={display_name!r}, artifact_uri={artifacts!r}, "
        f"serving_container_image_uri={image!r}).deploy(machine_type={machine_type!r})",
    ]


def upload_model(
    *,
    project: str,
    region: str,
    display_name: str,
    artifact_uri: str,
    image: str = DEFAULT_SERVING_IMAGE,
    api_endpoint: str = "",
    credentials=None,
    labels: dict | None = None,
) -> str:
    """Uploads the exported SavedModel as a Vertex AI Model (`aiplatform.Model.upload`).

    Args:
        project, region: Where the model goes.
        display_name: The model's name.
        artifact_uri: The gs:// directory holding the SavedModel (`AIP_MODEL_DIR`).
        image: The prediction image that serves it.
        api_endpoint: Endpoint override (a loopback http:// URL for a stand-in).
        credentials: `google.auth` credentials.
        labels: Model labels.

    Returns:
        The model's resource name, projects/P/locations/R/models/ID.

    Raises:
        UsageError: Vertex AI refused the upload (4xx) or the credentials failed.
        ServiceError: Vertex AI failed (5xx) or could not be reached.
    """
    from trainer.vertex import client  # pylint: disable=g-import-not-at-top
    from trainer.vertex.dependencies import require_module  # pylint: disable=g-import-not-at-top

    aiplatform = require_module("google.cloud.aiplatform", purpose="uploading a model")
    client.keep_stdout_for_the_result()
    init = {"project": project, "location": region, "credentials": credentials}
    if api_endpoint:
        init.update(api_endpoint=api_endpoint, api_transport="rest")
    with client.call_errors(
        purpose="uploading a model",
        refused="the model upload",
        expected="a SavedModel directory and an image it accepts",
        failed="upload the model",
        endpoint=api_endpoint or f"{region}-aiplatform.googleapis.com",
    ):
        aiplatform.init(**init)
        model = aiplatform.Model.upload(
            display_name=display_name,
            artifact_uri=artifact_uri,
            serving_container_image_uri=image,
            labels=labels or None,
            sync=True,
        )
        return model.resource_name
