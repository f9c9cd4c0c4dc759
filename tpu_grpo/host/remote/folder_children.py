"""Print the children of a gs:// folder (its data's `folder`), a name a line, with the Cloud Storage client that
MaxText's tpu-post-train extra brings (google-cloud-storage), which `ls` cannot do. MaxText's paths hold `//`, which its
objects' names do not."""

import json
import os


def children(folder: str) -> list[str]:
    from google.cloud import storage

    bucket, _, prefix = folder[len("gs://") :].partition("/")
    prefix = "/".join(part for part in prefix.split("/") if part) + "/"
    found = storage.Client().list_blobs(bucket, prefix=prefix, delimiter="/")
    list(found)  # the prefixes are known once the pages are read
    return [name[len(prefix) :].strip("/") for name in found.prefixes]


if __name__ == "__main__":
    print(*children(json.loads(os.environ["TPU_GRPO_INPUT"])["folder"]), sep="\n")
