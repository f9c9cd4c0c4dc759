"""`invoke pipeline --recover N`: a spot VM lost mid-training comes back and the run goes on.

The cloud here is a double at the Pulumi CLI's boundary: a `pulumi` on PATH that answers
`stack output` and `stack export` (the VM's Compute Engine status after a refresh) from a file the
test writes, as the CLI would, and whose `up` waits until the test has created the VM anew: a
fresh throwaway host (new boot disk, new host key) at another address, around the same data disk.
Both hosts are provisioned for real by the playbook, their MaxText being the stand-in installed
from a wheel (tests/doubles/wheels.py), and the second one resumes from the checkpoint the first left.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import pytest

from tests.doubles.pulumi_cli import INSTANCE, PulumiCli
from tests.doubles.wheels import WORKLOAD_STANDIN, workload_standin_wheel
from tests.host.conftest import invoke_on_stack as invoke
from tests.host.rootfs import TEST_VARS
from tests.support import FIXTURES, MODELS_KNOWN, modules, wait_for

STORE = "/mnt/disks/data/tpu-grpo/maxtext/llama3.1-8b-Instruct"  # the disk store, as the host names it


def vm_image(host, wheels: Path) -> None:
    """What the VM's image holds before it boots: uv finds the stand-in MaxText's wheel (system-wide
    configuration), and the stand-in's recorded output and pace in the user's home."""
    root = host.vm.root
    shutil.copytree(wheels, root / "opt/standin-wheels")
    (root / "etc/uv").mkdir(parents=True)
    (root / "etc/uv/uv.toml").write_text('find-links = ["/opt/standin-wheels"]\n')
    home = host.user.home
    shutil.copytree(FIXTURES, home / "fixtures")
    shutil.copy(MODELS_KNOWN, home)  # beside the fixtures: what the stand-in checks model names against
    (home / ".standin.json").write_text(json.dumps({"fixtures": "/home/tpu/fixtures", "line_delay_s": 0.01}))
    host.own(home)


def provisioning_vars(host) -> list[str]:
    values = [
        *(v for v in TEST_VARS if not v.startswith("maxtext_spec=")),
        f"maxtext_spec={WORKLOAD_STANDIN}==0.2.3",
        f"data_device={host.disk.device}",
    ]
    return [arg for value in values for arg in ("--var", value)]


def lost_at(host, point: tuple[str, int]) -> bool:
    """Whether the run on `host` has reached the point where the test preempts it: a training
    checkpoint of that step on the data disk, or an export job that has begun writing its log."""
    if not host.vm.first_process():
        return False
    step, number = point
    if step == "train":
        return host.vm.path(f"{STORE}/post-train/durable/checkpoints/actor/{number}").is_dir()
    jobs = host.vm.path("/mnt/disks/data/tpu-grpo/jobs")
    return jobs.is_dir() and any(
        job.name.endswith("-export") and (job / "log").is_file() and (job / "log").stat().st_size > 0
        for job in jobs.iterdir()
    )


@pytest.mark.parametrize(
    "losses, modules_after",
    [
        ([("train", 4, None)], ["train_rl", "report", "to_huggingface"]),
        ([("train", 4, None), ("train", 6, "TERMINATED")], ["train_rl", "report", "to_huggingface"]),
        ([("export", 0, None)], ["report", "to_huggingface"]),
    ],
    ids=["once-in-training", "deleted-then-stopped", "during-export"],
)
def test_a_spot_vm_lost_is_brought_back_and_the_run_goes_on(
    make_host, bridge, spot_project, tmp_path, losses, modules_after
):
    address = bridge.address("a")
    cloud_outputs = {
        "external_ip": address,
        "ssh_user": "tpu",
        "machine_type": "ct6e-standard-8t",
        "zone": "us-east5-b",
        "capacity": "spot",
    }
    cloud = PulumiCli(tmp_path / "cloud", cloud_outputs)
    cloud.hold_up()
    wheels = tmp_path / "wheels"
    workload_standin_wheel(wheels)
    first = make_host(boot=False, address=address, port=22, netns=bridge.netns("a"))
    vm_image(first, wheels)
    first.vm.boot()
    provisioned = invoke(first, cloud, spot_project, "provision", *provisioning_vars(first))
    out, err = provisioned.communicate(timeout=600)
    assert provisioned.returncode == 0, out + err

    pipeline = invoke(
        first,
        cloud,
        spot_project,
        "pipeline",
        "--run-name",
        "durable",
        "--batches",
        "8",
        "--recover",
        str(len(losses)),
        "--need-gb",
        "0.001,0.001",
        *provisioning_vars(first),
    )
    hosts = [first]

    def the_cloud() -> None:
        """Loses the VM at each point (deleted, as a spot preemption with instance_termination_action DELETE, or
        stopped: TERMINATED); creates it anew (the same data disk) when `up` asks, as Compute Engine does: another
        ephemeral address and a new host key, so a session or key kept from the lost VM reaches nothing."""
        for number, (step, at, status) in enumerate(losses, 1):
            point = (step, at)
            wait_for(lambda: lost_at(hosts[-1], point), 300, f"the run to reach {point}")
            cloud.set_status(status)
            hosts[-1].vm.lose()
            wait_for(lambda: sum(call.startswith("up --stack") for call in cloud.calls()) == number, 300, "pulumi up")
            label = "abc"[number]
            cloud.set_outputs({**cloud_outputs, "external_ip": bridge.address(label)})
            host = make_host(
                boot=False,
                disk=first.disk,
                address=bridge.address(label),
                port=22,
                netns=bridge.netns(label),
                uid=first.user.uid,
            )
            vm_image(host, wheels)
            host.vm.boot()
            hosts.append(host)
            cloud.set_status("RUNNING")
            cloud.created()

    preemptions = threading.Thread(target=the_cloud, daemon=True)
    preemptions.start()
    try:
        out, err = pipeline.communicate(timeout=900)
    finally:
        pipeline.kill()
        preemptions.join(timeout=30)

    assert pipeline.returncode == 0, out[-3000:] + err[-3000:]
    assert len(hosts) == len(losses) + 1
    ups = [call for call in cloud.calls() if call.startswith("up --stack")]
    for number, (_, _, status) in enumerate(losses, 1):
        assert (
            f"the VM is lost ({status or 'DELETED'}); bringing it back ({number} of {len(losses)}): invoke up, "
            "provision, then the same pipeline"
        ) in out
        assert (f"--replace {INSTANCE}" in ups[number - 1]) == (status == "TERMINATED")  # a stopped VM: replaced
    assert (first.state / "known_hosts").read_text().split() == hosts[-1].vm.known_hosts_line.split()  # new key
    assert "convert: done (done before)" in out and "run durable is complete" in out
    timeline = [json.loads(line) for line in (first.state / "runs/durable/timeline.jsonl").read_text().splitlines()]
    assert [entry["event"] for entry in timeline] == ["lost", "resumed"] * len(losses)
    for (step, number, _), resumed in zip(losses, timeline[1::2]):
        assert resumed["gone_s"] > 0
        if (
            step == "train"
        ):  # resumed after the checkpoint it was lost at, or a later one; at most checkpointPeriod redone
            assert resumed["from_checkpoint"] >= number and 0 <= resumed["steps_redone"] <= 2
        else:
            assert (resumed["from_checkpoint"], resumed["steps_redone"]) == (8, 0)  # training was done
    host = hosts[-1]
    records = [json.loads(line) for line in (host.user.home / ".standin/records.jsonl").read_text().splitlines()]
    assert modules(records) == modules_after
    trainings = sorted(
        job for job in host.vm.path("/mnt/disks/data/tpu-grpo/jobs").iterdir() if job.name.endswith("-train")
    )
    assert len(trainings) == 1 + sum(step == "train" for step, _, _ in losses)
    if losses[-1][0] == "train":
        resumed_log = (trainings[-1] / "log").read_bytes()
        assert f"restored checkpoint {timeline[-1]['from_checkpoint']} from ".encode() in resumed_log
        # the VM created anew starts warm: the compile cache is the data disk's, which the lost VM's training filled
        assert b"tpu-grpo: compile cache warm: 1 entries, " in resumed_log
        steps = [int(step) for step in re.findall(rb"\] Train step (\d+) ", resumed_log)]
        assert steps and min(steps) > timeline[-1]["from_checkpoint"] and max(steps) == 8
    actor = host.vm.path(f"{STORE}/post-train/durable/checkpoints/actor")
    assert sorted(int(path.name) for path in actor.iterdir()) == [6, 8]

    fetched = invoke(host, cloud, spot_project, "fetch", "--run", "durable", "--to", str(tmp_path / "model"))
    out, err = fetched.communicate(timeout=300)
    assert fetched.returncode == 0, out + err
    for path in (FIXTURES / "hf-export").iterdir():
        assert (tmp_path / "model" / path.name).read_bytes() == path.read_bytes()


def test_a_failure_that_is_not_a_lost_vm_stops_at_once(workload_host, tmp_path):
    """With --recover, a training that fails (MaxText exits non-zero) ends the pipeline as without
    it: no `pulumi up`, no second training."""
    cloud = PulumiCli(
        tmp_path / "cloud",
        {
            "external_ip": "127.0.0.1",
            "ssh_user": "tpu",
            "machine_type": "ct6e-standard-8t",
            "zone": "us-east5-b",
            "capacity": "spot",
        },
    )
    cloud.hold_up()
    host = workload_host
    host.control(exit_code={"train_rl": 3})
    result = host.invoke(
        "pipeline", "--batches", "4", "--recover", "2", "--need-gb", "0.001,0.001", env=cloud.on_path()
    )
    assert result.returncode == 1
    assert "error: train failed (job " in result.stderr and ", exit 3)" in result.stderr
    assert not any(call.startswith(("up", "refresh")) for call in cloud.calls())
    assert [r["module"].rsplit(".", 1)[-1] for r in host.records()] == ["to_maxtext", "train_rl"]
