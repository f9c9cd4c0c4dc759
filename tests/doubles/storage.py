"""gcp-storage-emulator, in memory, answering an object's download with its generation as Cloud Storage does.

Cloud Storage sends `x-goog-generation` and `x-goog-metageneration` with every object's data
(cloud.google.com/storage/docs/xml-api/reference-headers#xgooggeneration; the JSON API's `alt=media` the same). The
emulator's download (gcp_storage_emulator/handlers/objects.py, `download`) sends neither, so TensorStore's GCS driver
(kvstore/gcs_http/gcs_key_value_store.cc, which takes a read's generation from those headers) stamps what it read with
generation 0, and its next write conditioned on it, OCDBT's manifest after a re-read, is refused "Malformed
StorageGeneration" (IsValidStorageGeneration wants one above 0): a checkpoint the real bucket takes lost to the
stand-in. Run as `python -m tests.doubles.storage PORT`.
"""

from __future__ import annotations

import sys
import threading
from http import HTTPStatus

from gcp_storage_emulator import server
from gcp_storage_emulator.handlers import objects

emulator_download = objects.download


def download(request, response, storage, *args, **kwargs):
    emulator_download(request, response, storage, *args, **kwargs)
    if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        found = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        response["x-goog-generation"] = found["generation"]
        response["x-goog-metageneration"] = found["metageneration"]


objects.download = download  # the JSON API's `alt=media` GET calls it by this name
server.HANDLERS = tuple(
    (route, {method: download if handler is emulator_download else handler for method, handler in handlers.items()})
    for route, handlers in server.HANDLERS
)

if __name__ == "__main__":
    server.create_server("127.0.0.1", int(sys.argv[1]), in_memory=True).start()
    threading.Event().wait()
