"""A Vertex-AI-shaped REST server on loopback, for tests of `trainer.submit`.

    with running_stand_in() as server:
        ... --api_endpoint={server.url} ...

It answers what the SDK's `JobServiceClient` (REST transport) and
`ModelServiceClient` send: create, get and cancel of CustomJobs and
HyperparameterTuningJobs, and `models:upload`. A created job moves through
its states one step per GET, as Vertex AI's would between two polls:

    displayName        states read by successive GETs
    (any other)        QUEUED, PENDING, RUNNING, SUCCEEDED
    "fail-later"       QUEUED, RUNNING, FAILED (with an error message)
    "run-forever"      QUEUED, RUNNING, RUNNING, ...
    "refuse-me"        refused at create: 400 INVALID_ARGUMENT
    "fail-me"          failing at create: 503 UNAVAILABLE

A cancel request moves a job that has not ended to CANCELLING, then
CANCELLED; one that has ended is refused with 400 FAILED_PRECONDITION, as
Vertex AI refuses it. `requests` records every request in order.
"""

import contextlib
import http.server
import json
import re
import threading

FAILED_JOB_ERROR = "The replica workerpool0-0 exited with a non-zero status of 2."
_STATES = {
    "fail-later": ("JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_FAILED"),
    "run-forever": ("JOB_STATE_QUEUED", "JOB_STATE_RUNNING"),
}
_DEFAULT_STATES = (
    "JOB_STATE_QUEUED",
    "JOB_STATE_PENDING",
    "JOB_STATE_RUNNING",
    "JOB_STATE_SUCCEEDED",
)
_ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED")
_COLLECTION = re.compile(
    r"^/v1/projects/([^/]+)/locations/([^/]+)/(customJobs|hyperparameterTuningJobs)$"
)
_JOB = re.compile(
    r"^/v1/(projects/[^/]+/locations/[^/]+/(?:customJobs|hyperparameterTuningJobs)/[0-9]+)"
    r"(:cancel)?$"
)
_UPLOAD = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/models:upload$")
_MODEL = re.compile(r"^/v1/projects/[^/]+/locations/[^/]+/models/77$")


class _Job:
    def __init__(self, body: dict, states: tuple[str, ...]):
        self.body = body
        self.states = list(states)
        self.reads = 0

    @property
    def state(self) -> str:
        return self.states[min(self.reads, len(self.states) - 1)]

    def resource(self) -> dict:
        resource = {**self.body, "state": self.state}
        if self.state == "JOB_STATE_FAILED":
            resource["error"] = {"code": 3, "message": FAILED_JOB_ERROR}
        return resource


class VertexStandIn(http.server.ThreadingHTTPServer):
    """The server; `url` is its `--api_endpoint`."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)  # port 0: the kernel picks a free one
        self.requests = []
        self.jobs: dict[str, _Job] = {}
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_job(self, name: str, states: tuple[str, ...], **body) -> str:
        """A job that exists before the test (for --attach / --cancel); returns its name."""
        with self.lock:
            self.jobs[name] = _Job({"name": name, "displayName": "added", **body}, states)
        return name

    def state_of(self, name: str) -> str:
        with self.lock:
            return self.jobs[name].state


class _Handler(http.server.BaseHTTPRequestHandler):
    server: VertexStandIn

    def do_POST(self):  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.loads(raw or b"{}")
        with self.server.lock:
            self.server.requests.append({"path": path, "headers": dict(self.headers), "body": body})
            upload = _UPLOAD.match(path)
            if upload:  # Model.upload: a finished long-running operation naming the new model
                model = f"projects/{upload[1]}/locations/{upload[2]}/models/77"
                return self._reply(
                    200,
                    {
                        "name": f"{model}/operations/1",
                        "done": True,
                        "response": {
                            "@type": "type.googleapis.com/google.cloud.aiplatform.v1.UploadModelResponse",
                            "model": model,
                        },
                    },
                )
            job = _JOB.match(path)
            if job and job[2]:
                return self._cancel(job[1])
            match = _COLLECTION.match(path)
            if not match:
                return self._error(404, "NOT_FOUND", f"no route {path}")
            if body.get("displayName") == "refuse-me":
                return self._error(
                    400, "INVALID_ARGUMENT", "Machine type a9-huge is not supported."
                )
            if body.get("displayName") == "fail-me":
                return self._error(503, "UNAVAILABLE", "The service is currently unavailable.")
            name = f"projects/{match[1]}/locations/{match[2]}/{match[3]}/{4242 + len(self.server.jobs)}"
            created = _Job(
                {**body, "name": name, "createTime": "2026-11-30T00:00:00Z"},
                _STATES.get(body.get("displayName"), _DEFAULT_STATES),
            )
            self.server.jobs[name] = created
            return self._reply(200, created.resource())

    def _cancel(self, name: str):
        job = self.server.jobs.get(name)
        if job is None:
            return self._error(404, "NOT_FOUND", f"{name} not found")
        if job.state in _ENDED:
            return self._error(
                400,
                "FAILED_PRECONDITION",
                f"Cannot cancel {name} because it is in state {job.state}.",
            )
        job.states, job.reads = ["JOB_STATE_CANCELLING", "JOB_STATE_CANCELLED"], 0
        return self._reply(200, {})

    def do_GET(self):  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        with self.server.lock:
            self.server.requests.append({"path": path, "headers": dict(self.headers), "body": None})
            job = _JOB.match(path)
            if job and not job[2] and job[1] in self.server.jobs:
                found = self.server.jobs[job[1]]
                resource = found.resource()
                found.reads += 1
                return self._reply(200, resource)
            upload = next(
                (r["body"] for r in self.server.requests if r["path"].endswith("/models:upload")),
                None,
            )
            if _MODEL.match(path) and upload:
                return self._reply(200, {**upload["model"], "name": path[len("/v1/") :]})
            return self._error(404, "NOT_FOUND", f"no route {path}")

    def _error(self, status: int, code: str, message: str):
        self._reply(status, {"error": {"code": status, "status": code, "message": message}})

    def _reply(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def running_stand_in():
    """A `VertexStandIn` serving on a thread for the duration of the block."""
    server = VertexStandIn()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
