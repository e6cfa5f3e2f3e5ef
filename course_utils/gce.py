"""A fake Google Compute Engine metadata server on localhost, for lesson 08's preemption matrix.

TensorFlow's ``PreemptionCheckpointHandler`` picks its behaviour from the platform it detects when it is created
(``failure_handling_util.detect_platform`` in ``tensorflow/python/distribute/failure_handling/``): "on GCP" means a GET
of ``http://$GCE_METADATA_IP/computeMetadata/v1/instance/hostname`` (default address ``metadata.google.internal``)
with the header ``Metadata-Flavor: Google`` answered with status 200 (``on_gcp``); on a GCE VM with a GPU the handler
then polls ``.../instance/maintenance-event`` every second and treats ``TERMINATE_ON_HOST_MAINTENANCE`` as the notice
(``termination_watcher_function_gce``). Those two paths are all TensorFlow asks; this server answers them the way a GCE
VM's metadata server does (it refuses a request without the header, and sends the header back), so a worker started
with ``GCE_METADATA_IP`` set to :attr:`FakeMetadataServer.address` behaves as on a GCE VM. ``on_gcp=False``: every
path answers 404, so TensorFlow decides it is off Google Cloud without trying to reach the real address.

    with FakeMetadataServer() as server:
        subprocess.run(cmd, env={**os.environ, **server.env()})
        server.maintenance_event = "TERMINATE_ON_HOST_MAINTENANCE"  # the notice a GPU VM watches for
"""

from __future__ import annotations

import http.server
import os
import threading
import urllib.request

PREFIX = "/computeMetadata/v1/"
HOSTNAME_PATH = "instance/hostname"  # failure_handling_util.on_gcp
MAINTENANCE_PATH = "instance/maintenance-event"  # failure_handling_util.termination_watcher_function_gce
TERMINATE = "TERMINATE_ON_HOST_MAINTENANCE"
CONTROL_PATH = "/fake/maintenance-event"  # not GCE's: a POST here sets the maintenance event (the test's "notice")


class FakeMetadataServer:
    """A GCE metadata server for the two paths TensorFlow's failure handling reads (``on_gcp=True``), or none of them
    (``on_gcp=False``: 404 everywhere). Runs in a daemon thread; use as a context manager. ``requests`` lists the
    paths asked, in order."""

    def __init__(self, on_gcp: bool = True, hostname: str = "course-vm.c.course-project.internal"):
        self.on_gcp, self.hostname = on_gcp, hostname
        self.maintenance_event = "NONE"  # what a GCE VM answers when no maintenance is scheduled
        self.requests: list[str] = []
        self._server: http.server.ThreadingHTTPServer | None = None

    @property
    def address(self) -> str:
        """``host:port``: the value for ``GCE_METADATA_IP``."""
        host, port = self._server.server_address[:2]
        return f"{host}:{port}"

    def env(self) -> dict:
        """The variables that point TensorFlow (and a worker's notice) at this server."""
        return {"GCE_METADATA_IP": self.address, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}

    def _answer(self, path: str, flavored: bool) -> tuple[int, str]:
        if not self.on_gcp:
            return 404, "not found"
        if not flavored:
            return 403, "Missing Metadata-Flavor:Google header."
        if path == PREFIX + HOSTNAME_PATH:
            return 200, self.hostname
        if path == PREFIX + MAINTENANCE_PATH:
            return 200, self.maintenance_event
        return 404, "not found"

    def __enter__(self) -> "FakeMetadataServer":
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # what _Handler answers from
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fake-gce-metadata").start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    """One request to a :class:`FakeMetadataServer` (``self.server.fake``)."""

    def _reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Metadata-Flavor", "Google")
        self.send_header("Content-Type", "application/text")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        fake = self.server.fake
        path = self.path.split("?")[0]
        fake.requests.append(path)
        self._reply(*fake._answer(path, self.headers.get("Metadata-Flavor") == "Google"))

    def do_POST(self):  # noqa: N802
        if self.path != CONTROL_PATH:
            return self._reply(404, "not found")
        length = int(self.headers.get("Content-Length") or 0)
        fake = self.server.fake
        fake.maintenance_event = self.rfile.read(length).decode() or TERMINATE
        self._reply(200, fake.maintenance_event)

    def log_message(self, *args):  # quiet
        pass


def send_maintenance_notice(event: str = TERMINATE, address: str | None = None) -> None:
    """Ask the fake server at ``address`` (default: ``$GCE_METADATA_IP``) to announce ``event`` from now on: what a
    GCE VM's metadata server does before a host maintenance that will stop the VM."""
    address = address or os.environ["GCE_METADATA_IP"]
    request = urllib.request.Request(f"http://{address}{CONTROL_PATH}", data=event.encode(), method="POST")
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=5) as response:
        response.read()
