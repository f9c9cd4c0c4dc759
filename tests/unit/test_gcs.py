"""What tpu-grpo reads of a gs:// store from the laptop, against a local Cloud Storage emulator."""

from __future__ import annotations

import pytest
from google.cloud import storage

from tpu_grpo.host import gcs


def put(bucket: str, *names: str) -> None:
    handle = storage.Client().bucket(bucket)
    for name in names:
        handle.blob(name).upload_from_string(f"data of {name}".encode())


def test_split_takes_the_bucket_and_a_clean_prefix():
    assert gcs.split("gs://b/runs/llama/post-train//r1/checkpoints/actor") == (
        "b",
        "runs/llama/post-train/r1/checkpoints/actor/",
    )
    assert gcs.split("gs://b") == ("b", "")


def test_children_exists_and_download(bucket, tmp_path):
    put(
        bucket,
        "runs/r1/checkpoints/actor/2/model_params/a",
        "runs/r1/checkpoints/actor/10/x",
        "runs/r1/tensorboard/events.out.tfevents.1",
        "runs/r1/tensorboard/sub/ignored",
    )
    assert gcs.children(f"gs://{bucket}/runs/r1/checkpoints/actor") == ["10", "2"]
    assert gcs.exists(f"gs://{bucket}/runs/r1//checkpoints") and not gcs.exists(f"gs://{bucket}/runs/r2")
    assert gcs.download(f"gs://{bucket}/runs/r1/tensorboard", tmp_path) == ["events.out.tfevents.1"]
    assert (tmp_path / "events.out.tfevents.1").read_bytes() == b"data of runs/r1/tensorboard/events.out.tfevents.1"


def test_a_bucket_that_cannot_be_read_is_one_line(bucket):
    with pytest.raises(gcs.StoreError) as raised:
        gcs.children("gs://no-such-bucket-here/runs")
    assert str(raised.value).startswith("cannot list gs://no-such-bucket-here/runs (404 ")
    assert "\n" not in str(raised.value) and "fix: gcloud auth application-default login" in str(raised.value)


def test_a_runs_checkpoints_in_a_bucket_are_ordered_as_numbers(bucket):
    """Resuming and exporting take the newest checkpoint: 100 after 90, 10 after 9, whatever the names sort as."""
    from dataclasses import replace

    from tests.tutorial import RUN
    from tpu_grpo.catalog.stores import store_for
    from tpu_grpo.jobs import pipeline

    run = replace(RUN, store=store_for(f"gs://{bucket}/runs"))
    folder = f"runs/llama3.1-8b-Instruct/post-train/{RUN.run_name}/checkpoints/actor"
    put(
        bucket,
        *(f"{folder}/{step}/model_params/x" for step in ("100", "9", "90", "10", "2", "12")),
        f"{folder}/tmp-3/x",
    )
    put(bucket, *(f"{folder}/{step}/commit_success.txt" for step in ("100", "9", "90", "10", "2")))
    # step 12 holds no commit_success.txt: Orbax's save into gs:// was cut short (a preempted slice), so it is no step
    assert pipeline.checkpoint_steps(None, run) == [2, 9, 10, 90, 100]


def test_the_emulator_sends_an_objects_generation_with_its_data_as_cloud_storage_does(bucket, storage_emulator):
    """TensorStore conditions its next write of a file it read (OCDBT's manifest) on the x-goog-generation the
    download carried; without it the write is refused (tests/doubles/storage.py)."""
    import urllib.request

    blob = storage.Client().bucket(bucket).blob("runs/r1/manifest.ocdbt")
    blob.upload_from_string(b"manifest")
    for address in (  # the JSON API's alt=media (TensorStore's reads) and the download endpoint (mediaLink)
        f"{storage_emulator}/storage/v1/b/{bucket}/o/runs%2Fr1%2Fmanifest.ocdbt?alt=media",
        f"{storage_emulator}/download/storage/v1/b/{bucket}/o/runs%2Fr1%2Fmanifest.ocdbt?alt=media",
    ):
        with urllib.request.urlopen(address) as answer:
            assert answer.read() == b"manifest"
            assert answer.headers["x-goog-generation"] == str(blob.generation) != "0"
            assert answer.headers["x-goog-metageneration"] == str(blob.metageneration)
