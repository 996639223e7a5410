"""Runs gcp-storage-emulator (a Cloud Storage API emulator) with the generation headers that
real Cloud Storage sends with an object's bytes and that the emulator leaves out:
tensorstore, orbax's array writer, reads `x-goog-generation` from every download.

    python tests/gcs_emulator.py HOST PORT BUCKET   (in memory; conftest.py's gcs_emulator)
"""
import sys

from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

_download = objects.download


def download(request, response, storage, *args, **kwargs):
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
        obj = None
    if obj is not None:
        response["x-goog-generation"] = str(obj["generation"])
        response["x-goog-metageneration"] = str(obj["metageneration"])
    return _download(request, response, storage, *args, **kwargs)


objects.download = download  # before the server module builds its routing table

if __name__ == "__main__":
    from gcp_storage_emulator.__main__ import main

    host, port, bucket = sys.argv[1:]
    main(["start", "--host", host, "--port", port, "--in-memory", "--default-bucket", bucket, "--quiet"])
