"""Fixtures of the unit tier's tests of `invoke up` against the Pulumi CLI double."""

from __future__ import annotations

import pytest
import yaml

from tests.doubles.pulumi_cli import PulumiCli
from tests.support import TEST_TOKEN


@pytest.fixture
def spot_stack(stack_dir, stack_values):
    """A spot stack in us-east5-b that also accepts spot in us-east5-a and on-demand in us-central1-b."""
    values = {key: value for key, value in stack_values.items() if key != "tpu-grpo:reservation"}
    values.update(
        {
            "tpu-grpo:capacity": "spot",
            "tpu-grpo:fallback": [{"zone": "us-east5-a"}, {"zone": "us-central1-b", "capacity": "on-demand"}],
        }
    )
    (stack_dir / "Pulumi.dev.yaml").write_text(yaml.safe_dump({"config": values}))
    return stack_dir, values


@pytest.fixture
def cloud(tmp_path, home):
    cli = PulumiCli(tmp_path / "pulumi", {"external_ip": "127.0.0.1", "ssh_user": "ubuntu"})
    cli.gets_chips_anywhere()
    return cli, {**home, **cli.env(), "HF_TOKEN": TEST_TOKEN, "TPU_GRPO_STATE": str(tmp_path / "state")}
