"""Print the children of a gs:// folder (argv 1), a name a line, with the Cloud Storage client that MaxText's
tpu-post-train extra brings (google-cloud-storage), which `ls` cannot do. MaxText's paths hold `//`, which its
objects' names do not."""

import sys


def children(folder: str) -> list[str]:
    from google.cloud import storage

    bucket, _, prefix = folder[len("gs://") :].partition("/")
    prefix = "/".join(part for part in prefix.split("/") if part) + "/"
    found = storage.Client().list_blobs(bucket, prefix=prefix, delimiter="/")
    list(found)  # the prefixes are known once the pages are read
    return [name[len(prefix) :].strip("/") for name in found.prefixes]


if __name__ == "__main__":
    print(*children(sys.argv[1]), sep="\n")
