"""`pulumi up` entry point: the reservation-bound TPU VM of the stack's settings."""

import pulumi

from infra.program import declare, read_settings
from tpu_grpo.config.errors import SettingsError

try:
    settings = read_settings()
except SettingsError as error:
    raise pulumi.RunError(str(error)) from None  # one line, no traceback

for name, value in declare(settings).items():
    pulumi.export(name, value)
