"""Save a tokenizer (its data's `tokenizer`, a Hub id) into the export step's folder ($HF_EXPORT, where MaxText's
to_huggingface has just written the model) as transformers writes it; a gs:// folder through a
local copy, uploaded with the Cloud Storage client of MaxText's post-training extra."""

import json
import os
import pathlib
import tempfile


def save(source: str, folder: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    if not folder.startswith("gs://"):
        tokenizer.save_pretrained(folder)
        return
    from google.cloud import storage

    local = tempfile.mkdtemp()
    tokenizer.save_pretrained(local)
    bucket_name, _, prefix = folder[len("gs://") :].partition("/")
    bucket = storage.Client().bucket(bucket_name)
    for path in pathlib.Path(local).iterdir():
        bucket.blob(prefix.strip("/") + "/" + path.name).upload_from_filename(str(path))


if __name__ == "__main__":
    save(json.loads(os.environ["TPU_GRPO_INPUT"])["tokenizer"], os.environ["HF_EXPORT"])
