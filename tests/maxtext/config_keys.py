"""Prints every key MaxText's config takes on a command line, one a line: the fields of
maxtext.configs.types.MaxTextConfig (pyconfig refuses any other top-level key: `'KEY' not in ...`) and, for a field
that is a model of its own (`rl`, `dpo`, `lora`, `debug`, which forbid extra fields), its fields as `FIELD.SUB`.
Run with the MaxText tier's venv; its output is tpu_grpo/catalog/maxtext_keys.txt, which test_real_maxtext.py
holds to the installed package:

    ~/.cache/tpu-grpo/maxtext-0.2.3/bin/python tests/maxtext/config_keys.py > tpu_grpo/catalog/maxtext_keys.txt
"""

import importlib.metadata

from maxtext.configs import types
from pydantic import BaseModel


def keys() -> list[str]:
    found = []
    for name, field in types.MaxTextConfig.model_fields.items():
        found.append(name)
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found += [f"{name}.{sub}" for sub in field.annotation.model_fields]
    return sorted(found)


if __name__ == "__main__":
    version = importlib.metadata.version("maxtext")
    print(f"# MaxText {version}'s config keys (maxtext.configs.types.MaxTextConfig), by tests/maxtext/config_keys.py")
    print("\n".join(keys()))
