"""Print the children of a gs:// folder (its data's `folder`), a name a line, with the Cloud Storage client that
MaxText's tpu-post-train extra brings (google-cloud-storage), which `ls` cannot do; with `committed` (a file name),
only the children that hold that file: the checkpoints Orbax finished writing. MaxText's paths hold `//`, which its
objects' names do not."""

import json
import os


def children(folder: str, committed: str | None = None) -> list[str]:
    from google.cloud import storage

    name, _, prefix = folder[len("gs://") :].partition("/")
    prefix = "/".join(part for part in prefix.split("/") if part) + "/"
    client = storage.Client()
    found = client.list_blobs(name, prefix=prefix, delimiter="/")
    list(found)  # the prefixes are known once the pages are read
    names = [each[len(prefix) :].strip("/") for each in found.prefixes]
    bucket = client.bucket(name)
    return [each for each in names if not committed or bucket.blob(f"{prefix}{each}/{committed}").exists()]


if __name__ == "__main__":
    data = json.loads(os.environ["TPU_GRPO_INPUT"])
    print(*children(data["folder"], data.get("committed")), sep="\n")
