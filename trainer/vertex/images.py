"""Which images can run the job: Vertex AI's prebuilt ones (dated) and ours.

Vertex AI lists its prebuilt TensorFlow training images with an end of
availability, after which "you can no longer use images for this framework
version" (Vertex might block the creation of new resources). The table
(`trainer/vertex/tables/images.json`, with its sources) is what Vertex listed on
`TABLE_DATE`; a prebuilt image past its date is refused with that date, and a URI under Vertex's training repositories that is not in
the table (a PyTorch image, a mistyped version) is refused as unknown. Even a
listed image runs TF 2.17 or older: pip must then replace it with TF 2.21 and its
CUDA libraries, so our own image (docker/, built by Cloud Build) is the path
that works.

An image's CPU architecture is declared (`--image_architecture`) or inferred
(prebuilt images are amd64); ARM machines (A4X, GB200) run arm64 images only.
"""

import dataclasses
import datetime
import re

from trainer.vertex import machines, tables
from trainer.vertex.checks import quoted, require

ARCHITECTURES = ("amd64", "arm64", "multi")


@dataclasses.dataclass(frozen=True)
class PrebuiltImage:
    """One prebuilt image as Vertex AI lists it."""

    name: str
    framework_version: str
    end_of_availability: datetime.date
    architecture: str = "amd64"


_IMAGES = tables.MapOf(
    tables.Record({"framework_version": tables.TEXT, "end_of_availability": tables.DATE})
)
SHAPE = tables.table(
    {
        "training_images": _IMAGES,
        "prediction_images": _IMAGES,
        "default_prediction_image": tables.TEXT,
    }
)


def check_table(table: dict, source: str) -> None:
    """The rules of images.json its shape cannot say."""
    default = table["default_prediction_image"]
    match = _PREBUILT_PREDICTION.match(default)
    tables.expect(
        bool(match) and match.group(1) in table["prediction_images"],
        source,
        "default_prediction_image",
        default,
        "the URI of an image of prediction_images, e.g. "
        "us-docker.pkg.dev/vertex-ai/prediction/tf2-cpu.2-15:latest",
    )


def _images(rows: dict) -> dict[str, PrebuiltImage]:
    return {
        name: PrebuiltImage(
            name,
            row["framework_version"],
            datetime.date.fromisoformat(row["end_of_availability"]),
        )
        for name, row in rows.items()
    }


_PREBUILT_TRAINING = re.compile(
    r"^(?:[a-z0-9]+-docker\.pkg\.dev/vertex-ai/training/|gcr\.io/cloud-aiplatform/training/)"
    r"([^:@/]+)(?::[^@]*)?(?:@sha256:[0-9a-f]{64})?$"
)
_PREBUILT_TRAINING_PREFIX = re.compile(
    r"^([a-z0-9]+-docker\.pkg\.dev/vertex-ai/training/|gcr\.io/cloud-aiplatform/training/)"
)
_PREBUILT_PREDICTION = re.compile(
    r"^(?:[a-z0-9]+-docker\.pkg\.dev/vertex-ai/prediction/|gcr\.io/cloud-aiplatform/"
    r"prediction/)([^:@/]+)(?::[^@]*)?(?:@sha256:[0-9a-f]{64})?$"
)

TABLE = tables.load("images.json", SHAPE, check_table)
TABLE_DATE = TABLE["table_date"]
SOURCES = tuple(TABLE["sources"])
TRAINING_IMAGES = _images(TABLE["training_images"])
PREDICTION_IMAGES = _images(TABLE["prediction_images"])
# The newest TensorFlow prediction image Vertex AI lists: what serving defaults to.
DEFAULT_PREDICTION_IMAGE = TABLE["default_prediction_image"]


def is_prebuilt_training_uri(image_uri: str) -> bool:
    """Whether the URI is under one of Vertex AI's prebuilt training repositories."""
    return bool(_PREBUILT_TRAINING_PREFIX.match(image_uri))


def _listed(name_match, table, kind, image_uri):
    name = name_match.group(1) if name_match else ""
    require(
        name in table,
        f"--{kind} {quoted(image_uri)} is not a TensorFlow image Vertex AI lists (as of "
        f"{TABLE_DATE}: {', '.join(sorted(table))}), expected one of those or our own "
        f"image; build ours with docker/cloudbuild.yaml (docs/vertex.md section 7)",
    )
    return table[name]


def check_training_image(
    image_uri: str, *, today: datetime.date, allow_ended: bool = False
) -> PrebuiltImage | None:
    """The prebuilt image the URI names, checked; None for our own image.

    Raises:
        UsageError: An unknown prebuilt URI, or one past its end of availability
            (unless `allow_ended`).
    """
    if not is_prebuilt_training_uri(image_uri):
        return None
    image = _listed(
        _PREBUILT_TRAINING.match(image_uri), TRAINING_IMAGES, "container_uri", image_uri
    )
    require(
        allow_ended or today <= image.end_of_availability,
        f"--container_uri {quoted(image_uri)} (TensorFlow {image.framework_version}) reached "
        f"its end of availability on {image.end_of_availability.isoformat()}, expected an "
        f"image Vertex AI still runs; use our image (docker/cloudbuild.yaml builds it: "
        f"--container_uri=REGION-docker.pkg.dev/PROJECT/tfdist/trainer:TAG), or pass "
        f"--allow_ended_image if Vertex AI still runs it in your project",
    )
    return image


def check_prediction_image(image_uri: str, *, today: datetime.date) -> None:
    """Refuses a Vertex prebuilt prediction image that is unknown or past its end."""
    match = _PREBUILT_PREDICTION.match(image_uri)
    if (
        not match
        and "vertex-ai/prediction/" not in image_uri
        and "cloud-aiplatform/prediction/" not in image_uri
    ):
        return  # our own serving image
    image = _listed(match, PREDICTION_IMAGES, "serving_container_uri", image_uri)
    require(
        today <= image.end_of_availability,
        f"--serving_container_uri {quoted(image_uri)} reached its end of availability on "
        f"{image.end_of_availability.isoformat()}, expected an image Vertex AI still "
        f"serves from",
    )


def image_architecture(image_uri: str, declared: str) -> str:
    """The image's architecture: declared, else amd64 (prebuilt images and our default build)."""
    require(
        not declared or declared in ARCHITECTURES,
        f"--image_architecture is {quoted(declared)}, expected one of: "
        f"{', '.join(ARCHITECTURES)} (multi: a multi-arch image such as "
        f"docker/cloudbuild-multiarch.yaml builds)",
    )
    if is_prebuilt_training_uri(image_uri):
        require(
            declared in ("", "amd64"),
            f"--image_architecture={declared} for the prebuilt image {quoted(image_uri)}, "
            f"which is amd64; drop --image_architecture",
        )
        return "amd64"
    return declared or "amd64"


def check_architecture(*, flag: str, machine_type: str, architecture: str) -> None:
    """Refuses an amd64-only image on an ARM machine (A4X)."""
    require(
        not machines.is_arm(machine_type) or architecture in ("arm64", "multi"),
        f"{flag}={machine_type} has ARM (aarch64) host CPUs and runs arm64 images only, "
        f"got an {architecture} image; build a multi-arch image "
        f"(docker/cloudbuild-multiarch.yaml) and pass --image_architecture=multi, or "
        f"pick an x86 machine such as a4-highgpu-8g",
    )
