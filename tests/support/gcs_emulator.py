"""Runs gcp-storage-emulator (a Cloud Storage API emulator) with two things real Cloud Storage
does and the emulator leaves out:

  * the generation headers sent with an object's bytes: tensorstore, orbax's array writer, reads
    `x-goog-generation` from every download, and so does paravt_jax.infra.storage.read_versioned;
  * generation preconditions: an upload, delete or compose with `ifGenerationMatch=G` takes
    effect only while the object's generation is G (0: while it does not exist), else answers
    412 and changes nothing (the emulator ignores the parameter). The workdir lock on gs://
    (paravt_jax/infra/locking.py) and the Appender's compose rely on them. The emulator serves one
    request at a time (http.server.HTTPServer), so the check and the write below are atomic,
    as they are in Cloud Storage.

    python tests/support/gcs_emulator.py HOST PORT BUCKET   (in memory; conftest.py's gcs_emulator)
"""
import sys
from http import HTTPStatus

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download, _insert, _delete, _compose = objects.download, objects.insert, objects.delete, objects.compose


def download(request, response, storage, *args, **kwargs):
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
        obj = None
    if obj is not None:
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])
    return _download(request, response, storage, *args, **kwargs)


def _precondition_holds(request, response, storage, name) -> bool:
    """Whether the request's ifGenerationMatch (if any) holds for object `name`; if not, answers
    412 as Cloud Storage does."""
    wanted = request.query.get("ifGenerationMatch")
    if not wanted or name is None:
        return True
    try:
        current = str(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
    except NotFound:
        current = "0"
    if current == wanted[0]:
        return True
    _ = request.data  # the body read, as a served request's is
    response.status = HTTPStatus.PRECONDITION_FAILED
    message = "At least one of the pre-conditions you specified did not hold."
    response.json({"error": {"code": 412, "message": message,
                             "errors": [{"domain": "global", "reason": "conditionNotMet", "message": message}]}})
    return False


def _upload_name(request):
    """The object an upload request names (media, multipart, or the start of a resumable one)."""
    if "name" in request.query:
        return request.query["name"][0]
    kind = request.query.get("uploadType", [""])[0]
    if kind == "multipart":
        return request.data["meta"].get("name")
    if kind == "resumable" and "upload_id" not in request.query and isinstance(request.data, dict):
        return request.data.get("name")
    return None


def insert(request, response, storage, *args, **kwargs):
    if _precondition_holds(request, response, storage, _upload_name(request)):
        return _insert(request, response, storage, *args, **kwargs)


def delete(request, response, storage, *args, **kwargs):
    if _precondition_holds(request, response, storage, request.params["object_id"]):
        return _delete(request, response, storage, *args, **kwargs)


def compose(request, response, storage, *args, **kwargs):
    if _precondition_holds(request, response, storage, request.params["object_id"]):
        return _compose(request, response, storage, *args, **kwargs)


# before the server module builds its routing table
objects.download, objects.insert, objects.delete, objects.compose = download, insert, delete, compose

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main

    host, port, bucket = sys.argv[1:]
    main(["start", "--host", host, "--port", port, "--in-memory", "--default-bucket", bucket, "--quiet"])
